"""The torch-free runtime: manifest, tokenisation, ONNX Runtime backend, search, and the Python API
per medium: ``Translator`` (text), ``Transcriber`` (audio, the ``audio`` extra), ``Captioner``
(images, the ``image`` extra); the extras are imported only when a file or clip is read."""

from s2s_deploy.format.manifest import Manifest, load_manifest
from s2s_deploy.format.vocab import Vocabulary
from s2s_deploy.runtime.captioner import Caption, Captioner
from s2s_deploy.runtime.decoding import SearchConfig
from s2s_deploy.runtime.features import Decoded, Segment
from s2s_deploy.runtime.search import Hypothesis, search
from s2s_deploy.runtime.transcriber import Transcriber, Transcription
from s2s_deploy.runtime.translator import Translation, Translator, translate

__all__ = [
    "Caption",
    "Captioner",
    "Decoded",
    "Hypothesis",
    "Manifest",
    "SearchConfig",
    "Segment",
    "Transcriber",
    "Transcription",
    "Translation",
    "Translator",
    "Vocabulary",
    "load_manifest",
    "search",
    "translate",
]
