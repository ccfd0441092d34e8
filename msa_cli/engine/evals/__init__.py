"""Answer quality on long documents (`msa eval ruler`, `msa eval file`): tasks generated from a
seed, scoring, a sweep over lengths and attention modes, and its results file.

    haystack.py   noise, prose (a shipped public-domain book or the user's) and word pools
    needles.py    RULER's needle tasks and variable tracking
    words.py      RULER's common- and frequent-word extraction
    tasks.py      the tasks by name, a sweep's items, each sized to its length in tokens
    sizing.py     the number of haystack units that fills a token budget
    scoring.py    RULER's string matches; exact match, contains and token F1
    user_set.py   the user's own question set, one JSON object a line
    results.py    an item's stable id, the results file a run appends to and resumes from
    runner.py     asking each item in each attention mode, through the engine's sessions
"""
