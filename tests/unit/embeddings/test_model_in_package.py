"""The default model loads offline: WordLlama's `l2_supercat` weights and tokenizer are files
inside the installed `wordllama` package (so inside the container image), which is where
service/embeddings/wordllama.py points the loader, with downloads disabled."""

from __future__ import annotations

from pathlib import Path

import pytest
import wordllama

from service.embeddings.wordllama import WordLlamaEmbedder

PACKAGE = Path(wordllama.__file__).parent
WEIGHTS = PACKAGE / "weights" / "l2_supercat_256.safetensors"
TOKENIZER = PACKAGE / "tokenizers" / "l2_supercat_tokenizer_config.json"


def test_the_installed_package_holds_the_weights_and_tokenizer() -> None:
    assert WEIGHTS.is_file()
    assert WEIGHTS.stat().st_size > 1_000_000  # the real tensors, not a pointer file
    assert TOKENIZER.is_file()
    assert TOKENIZER.stat().st_size > 1_000


def test_the_embedder_loads_them_with_downloads_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A HOME with no cache in it: the only copy is the package's."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(wordllama.WordLlama, "DEFAULT_CACHE_DIR", tmp_path / ".cache" / "wordllama")
    embedder = WordLlamaEmbedder()
    assert embedder.dimensions == 256
    assert not (tmp_path / ".cache").exists()
