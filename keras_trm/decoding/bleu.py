"""Corpus BLEU with sacreBLEU (Post 2018), on detokenized text."""

import sacrebleu


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
        ValueError: lengths differ.

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
    if len(hypotheses) != len(references):
        raise ValueError(
            f"`hypotheses` has {len(hypotheses)} sentences but `references` "
            f"has {len(references)}"
        )
    metric = sacrebleu.metrics.BLEU(tokenize=tokenize, lowercase=lowercase)
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return result.score, str(metric.get_signature()), str(result)
