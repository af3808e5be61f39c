"""Split a text into overlapping windows of the embedder's tokens, keeping character offsets."""

from __future__ import annotations

from collections.abc import Callable


def chunk_text(
    text: str, token_spans: Callable[[str], list[tuple[int, int]]], size: int, overlap: int
) -> list[str]:
    """Windows of at most `size` tokens, each starting `size - overlap` tokens after the previous one.

    Windows are cut at token boundaries in the original text, so a chunk is an exact substring; a text
    that fits in one window is returned whole (an empty text gives one empty chunk).
    """
    if overlap >= size:
        raise ValueError("overlap must be smaller than size")
    spans = token_spans(text)
    if len(spans) <= size:
        return [text]
    step = size - overlap
    chunks = []
    for start in range(0, len(spans), step):
        window = spans[start : start + size]
        chunks.append(text[window[0][0] : window[-1][1]])
        if start + size >= len(spans):
            break
    return chunks
