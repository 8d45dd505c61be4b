"""The reserved tokens and ids of keras_trm's vocabularies
(``keras_trm.text``).

Kept apart from the tokenizers (the in-graph ones need TensorFlow Text) so
that the backend-neutral code can name them. The searches take their
special ids as arguments; these are only the defaults.
"""

PAD, UNK, START, END = "[PAD]", "[UNK]", "[START]", "[END]"
RESERVED_TOKENS = (PAD, UNK, START, END)
PAD_ID, UNK_ID, START_ID, END_ID = 0, 1, 2, 3
