"""Greedy decoding of an s2s-deploy export with numpy and onnxruntime only, from docs/manifest.md.

usage: python translate.py EXPORT_DIR "sentence" ...
"""

import json
import re
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

folder = Path(sys.argv[1])
manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
src_vocab, tgt_vocab = manifest["vocab"]["source"], manifest["vocab"]["target"]
special, src_special = manifest["special_tokens"], src_vocab["special"]  # the target's ids, the source's
index = {token: i for i, token in enumerate(src_vocab["tokens"])}
encoder = ort.InferenceSession(str(folder / manifest["graphs"]["encoder"]["file"]), providers=["CPUExecutionProvider"])
decoder = ort.InferenceSession(str(folder / manifest["graphs"]["decoder"]["file"]), providers=["CPUExecutionProvider"])
decoder_inputs = {io["name"] for io in manifest["graphs"]["decoder"]["inputs"]}
max_len = manifest["limits"]["max_target_length"] or 256


def split(text, level):
    return list(text) if level == "char" else re.findall(r"\w+|[^\w\s]", text)


for text in sys.argv[2:]:
    ids = src_vocab["prefix"] + [index.get(t, src_special["unk"]) for t in split(text, src_vocab["level"])]
    ids += src_vocab["suffix"]
    src, src_len = np.array([ids], dtype=np.int64), np.array([len(ids)], dtype=np.int64)
    encoder_names = [io["name"] for io in manifest["graphs"]["encoder"]["outputs"]]
    encoded = dict(zip(encoder_names, encoder.run(encoder_names, {"src": src, "src_len": src_len}), strict=True))
    feeds = {m["name"]: encoded[m["name"]] for m in manifest["memory"] if m["name"] in decoder_inputs}
    for s in manifest["state"]:
        shape = [1 if d == "batch" else d for d in s["shape"]]
        initial = encoded[f"init_{s['name']}"] if s["init"] == "encoder" else np.zeros(shape, s["dtype"])
        feeds[f"past_{s['name']}"] = initial
    token, output = special["decoder_start"], []
    for step in range(max_len):
        feeds.update(tokens=np.array([token], dtype=np.int64), reorder=np.zeros(1, dtype=np.int64))
        if "step" in decoder_inputs:
            feeds["step"] = np.array(step, dtype=np.int64)
        names = ["top_ids"] + [f"present_{s['name']}" for s in manifest["state"]]  # top_k defaults to 1
        top_ids, *state = decoder.run(names, feeds)
        feeds.update({f"past_{s['name']}": value for s, value in zip(manifest["state"], state, strict=True)})
        token = int(top_ids[0, 0])
        if token == special["eos"]:
            break
        output.append(token)
    hidden = {special["pad"], special["bos"], special["decoder_start"], *tgt_vocab["hidden"]}
    words = [tgt_vocab["tokens"][i] for i in output if i not in hidden]
    print(("" if tgt_vocab["level"] == "char" else " ").join(words))
