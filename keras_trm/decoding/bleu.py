"""Corpus BLEU with sacreBLEU (Post 2018), on detokenized text."""

import re

import sacrebleu


def _check_corpus(hypotheses, references):
    """Same lengths, at least one: sacreBLEU raises a bare IndexError on an
    empty corpus."""
    if len(hypotheses) != len(references):
        raise ValueError(f"`hypotheses` has {len(hypotheses)} sentences but "
                         f"`references` has {len(references)}")
    if not len(hypotheses):
        raise ValueError(
            "`hypotheses` and `references` must hold at least one sentence, "
            "got 0: BLEU is undefined for an empty corpus")


def corpus_bleu(hypotheses, references, tokenize="13a", lowercase=False):
    """sacreBLEU corpus BLEU.

    Args:
        hypotheses: list of str, detokenized system outputs.
        references: list of str (one reference per sentence), same length.
        tokenize: sacreBLEU tokenizer (default ``"13a"``, WMT's standard).
        lowercase: False for cased BLEU.

    Returns:
        ``(score, signature, full)``: BLEU (float, 0-100), the sacreBLEU
        signature string, and the full ``BLEU = ...`` line.

    Raises:
        ValueError: lengths differ, or no sentence (an empty corpus has no
            BLEU).

    Example:

    >>> score, signature, line = corpus_bleu(["Ein Hund läuft ."],
    ...                                      ["Ein Hund läuft ."])
    >>> round(score, 1), signature.split("|")[:2]
    (100.0, ['nrefs:1', 'case:mixed'])
    >>> corpus_bleu(["a", "b"], ["a"])
    Traceback (most recent call last):
    ...
    ValueError: `hypotheses` has 2 sentences but `references` has 1
    """
    _check_corpus(hypotheses, references)
    metric = sacrebleu.metrics.BLEU(tokenize=tokenize, lowercase=lowercase)
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return result.score, str(metric.get_signature()), str(result)


def compound_split_bleu(hypotheses, references, language="de"):
    """The paper's tokenized BLEU with compound splitting (tensor2tensor's
    ``get_ende_bleu.sh``), for comparison with its 27.3 / 28.4 EN-DE.

    Both sides are tokenized with the Moses tokenizer (``sacremoses``, the
    Python port of ``tokenizer.perl -l <language>``, with its default
    escaping), every hyphen between two non-space characters is split into
    `` ##AT##-##AT## `` (``perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'``),
    and BLEU is computed on those tokens with sacreBLEU
    (``tokenize="none"``, cased, as ``multi-bleu.perl``). Not comparable
    with sacreBLEU scores of detokenized text; report both.

    Args:
        hypotheses: list of str, detokenized outputs.
        references: list of str, same length.
        language: the target language code for the Moses tokenizer.

    Returns:
        ``(score, full)``: BLEU (float, 0-100) and the ``BLEU = ...`` line.

    Raises:
        ValueError: as ``corpus_bleu``.

    Example:
        >>> compound_split_bleu(["Ein Eis-Café."], ["Ein Eis-Café."])[0]
        100.00000000000004
    """
    # One pass, as perl's s///g: in "a-b-c" only the first hyphen splits
    # (the matches would overlap), exactly as t2t's script.
    return _moses_bleu(hypotheses, references, language,
                       lambda t: re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", t))


def tokenized_bleu(hypotheses, references, language="de", lowercase=True):
    """BLEU on Moses-tokenized text, lower-cased by default: the metric of
    the Multi30k papers that train on the lower-cased, tokenized release
    (e.g. Wu et al. 2021, fairseq's BLEU), for a like-for-like comparison.

    Tokenized and scored as ``compound_split_bleu``, without the hyphen
    splitting, lower-cased both sides.

    Args:
        hypotheses, references, language: as ``compound_split_bleu``.
        lowercase: lower-case both sides (the anchor's setting).

    Returns:
        ``(score, full)``: BLEU (float, 0-100) and the ``BLEU = ...`` line.

    Raises:
        ValueError: as ``corpus_bleu``.

    Example:
        >>> round(tokenized_bleu(["Zwei Hunde spielen im Schnee."],
        ...                      ["zwei Hunde spielen im Schnee ."])[0], 2)
        100.0
    """
    return _moses_bleu(hypotheses, references, language,
                       str.lower if lowercase else str)


def _moses_bleu(hypotheses, references, language, prepare):
    """sacreBLEU on ``prepare`` of each Moses-tokenized sentence."""
    from sacremoses import MosesTokenizer

    _check_corpus(hypotheses, references)
    moses = MosesTokenizer(lang=language)

    def tokens(texts):
        return [prepare(moses.tokenize(t, return_str=True, escape=True)) for t in texts]

    metric = sacrebleu.metrics.BLEU(tokenize="none", force=True)  # tokenized on purpose
    result = metric.corpus_score(tokens(hypotheses), [tokens(references)])
    return result.score, str(result)
