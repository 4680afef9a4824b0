"""The torch-free runtime: manifest, tokenisation, ONNX Runtime backend, search, translation."""

from s2s_deploy.format.manifest import Manifest, load_manifest
from s2s_deploy.format.vocab import Vocabulary
from s2s_deploy.runtime.decoding import SearchConfig
from s2s_deploy.runtime.search import Hypothesis, search
from s2s_deploy.runtime.translator import Translation, Translator, translate

__all__ = [
    "Hypothesis",
    "Manifest",
    "SearchConfig",
    "Translation",
    "Translator",
    "Vocabulary",
    "load_manifest",
    "search",
    "translate",
]
