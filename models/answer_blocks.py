"""What an answer's decode steps read besides the blocks they choose (msa_decode.py), per layer:
the far blocks the question's last query block read (msa.py records them), so that the whole
answer keeps what the question found, and the blocks the answer's steps followed on to, where a
step was copying from the end of a far block (`msa_decode.blocks_after_peaks`).

A `KVCache` owns one (`cache.answer`): it describes that cache's tokens, and the cache forgets
it where those tokens change (a prefill chunk, `ForwardContext.open`; a truncation)."""

from __future__ import annotations


class AnswerBlocks:
    def __init__(self) -> None:
        self._question: dict[int, list[int]] = {}  # layer -> blocks, ascending
        self._followed: dict[int, list[int]] = {}  # layer -> blocks, oldest first

    def keep_question(self, layer: int, blocks: list[int]) -> None:
        """Record the blocks the question's last query block read in `layer`; the layer's
        followed blocks go with the question they followed."""
        self._question[layer] = sorted(blocks)
        self._followed.pop(layer, None)

    def question(self, layer: int) -> list[int]:
        """The question's blocks of `layer` (empty: none; the last prefill was not a question)."""
        return self._question.get(layer, [])

    def follow(self, layer: int, blocks: list[int], limit: int) -> None:
        """Record blocks a decode step of `layer` followed on to; the later steps read them too,
        the `limit` most recently followed."""
        kept = self._followed.setdefault(layer, [])
        for b in blocks:
            if b in kept:
                kept.remove(b)
            kept.append(b)
        del kept[:-limit]

    def blocks(self, layer: int) -> list[int]:
        """What a decode step of `layer` reads besides its own choice, ascending."""
        return sorted(set(self.question(layer)).union(self._followed.get(layer, [])))

    def forget(self) -> None:
        self._question, self._followed = {}, {}
