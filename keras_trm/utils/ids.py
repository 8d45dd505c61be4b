"""The reserved tokens and ids of keras_trm's vocabularies (``keras_trm.text``),
apart from the tokenizers (the in-graph ones need TensorFlow Text) so that
backend-neutral code can name them; the searches take them as arguments.
"""

PAD, UNK, START, END = "[PAD]", "[UNK]", "[START]", "[END]"
RESERVED_TOKENS = (PAD, UNK, START, END)
PAD_ID, UNK_ID, START_ID, END_ID = 0, 1, 2, 3
