"""What an answer's decode steps read besides the blocks they choose (msa_decode.py): per layer,
the far blocks the question's last query block read (msa.py records them), so that the whole
answer keeps what the question found, and the blocks the answer's steps followed on to, where a
step was copying from the end of a far block (`msa_decode.blocks_after_peaks`); in every layer,
the far blocks some layer's step copied from (`msa_decode.blocks_copied_from`), so that a layer
whose own choice lost the block the answer is copying still reads it, and the far blocks the
question found by its queries' peak probabilities in some layer (question_peaks.py).

A `KVCache` owns one (`cache.answer`): it describes that cache's tokens, and the cache forgets
it where those tokens change (a prefill chunk, `ForwardContext.open`; a truncation)."""

from __future__ import annotations


class AnswerBlocks:
    def __init__(self) -> None:
        self._question: dict[int, list[int]] = {}  # layer -> blocks, ascending
        self._followed: dict[int, list[int]] = {}  # layer -> blocks, oldest first
        self._copied: dict[int, int] = {}  # block -> the position of the step that copied it
        self._found: set[int] = set()

    def keep_question(self, layer: int, blocks: list[int]) -> None:
        """Record the blocks the question's last query block read in `layer`; the blocks
        followed and copied from go with the question whose answer read them."""
        self._question[layer] = sorted(blocks)
        self._followed.pop(layer, None)
        self._copied = {}

    def question(self, layer: int) -> list[int]:
        """The question's blocks of `layer` (empty: none; the last prefill was not a question)."""
        return self._question.get(layer, [])

    def keep_found(self, blocks: list[int]) -> None:
        """Record far blocks the question's queries found in some layer (msa.py): every layer
        of the answer's steps reads them."""
        self._found.update(blocks)

    def follow(self, layer: int, blocks: list[int], limit: int) -> None:
        """Record blocks a decode step of `layer` followed on to; the later steps read them too,
        the `limit` most recently followed."""
        _keep_recent(self._followed.setdefault(layer, []), blocks, limit)

    def copy_from(self, blocks: list[int], position: int, limit: int) -> None:
        """Record far blocks that the decode step at `position` copied from, in some layer:
        every layer of the steps after it reads them, the first `limit` blocks copied (an
        answer copies from a few; the bound keeps a long answer's steps small). The step's own
        later layers do not, so that a step computed layer by layer reads what the fused step,
        told the answer's blocks once for all its layers, reads."""
        for b in blocks:
            if b not in self._copied and len(self._copied) < limit:
                self._copied[b] = position

    def blocks(self, layer: int, position: int | None = None) -> list[int]:
        """What a decode step of `layer` at `position` reads besides its own choice, ascending
        (None: with every block copied from so far)."""
        copied = [b for b, at in self._copied.items() if position is None or at < position]
        return sorted(
            set(self.question(layer)).union(self._followed.get(layer, []), copied, self._found)
        )

    def forget(self) -> None:
        self._question, self._followed, self._copied, self._found = {}, {}, {}, set()


def _keep_recent(kept: list[int], blocks: list[int], limit: int) -> None:
    """`kept` (oldest first) with `blocks` moved or added to its end, cut to the last `limit`."""
    for b in blocks:
        if b in kept:
            kept.remove(b)
        kept.append(b)
    del kept[:-limit]
