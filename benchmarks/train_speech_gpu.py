"""Train the bundled speech model (``plugins/speech.py``) on a lent GPU machine, from this repository alone.

The device machine has Python 3.12 with torch and CUDA, 16 cores and no network, and no
espeak-ng. So ``prepare`` (run here, once, with network) fills ``.speechdebs/`` (kept out of git by
.git/info/exclude): the espeak-ng .deb files, a stub ``libpcaudio.so.0`` (espeak-ng links the
PulseAudio/ALSA player library, whose dependencies pull in X11 and D-Bus; ``--stdout`` never
plays sound, so a stub that opens no device stands in), and cp312 wheels of the few Python
packages the data path needs besides torch (numpy, soundfile, soxr, safetensors, tqdm), unpacked
on the device only where the module is missing. ``run`` (on the device) unpacks espeak-ng into a
private prefix, synthesises the en-fr task's English with ``make_speech_data`` in 16 processes,
trains on CUDA within a wall-clock budget, scores the held-out voices, and writes the checkpoint
and the log to ``--out``.

    python benchmarks/train_speech_gpu.py prepare                      # here
    python3 benchmarks/train_speech_gpu.py run --out "$OUT"            # on the device, carry .speechdebs
    python benchmarks/train_speech_gpu.py prepare --copies 2           # each training sentence read twice
    python3 benchmarks/train_speech_gpu.py run --out "$OUT" --init plugins/checkpoints/speech.safetensors
    python benchmarks/train_speech_gpu.py prepare --utterances 5000 --valid 300 --test 1000 --natural 7000 \\
        --natural-valid 300 --natural-test 600 --joined 1500          # issue 48: natural phrasings, joined clips
    python3 benchmarks/train_speech_gpu.py run --out "$OUT" --init plugins/checkpoints/speech.safetensors \\
        --lr 8e-4 --warmup 150 --shard-size 100 --effects 0.3 --nonspeech-train 2000 --nonspeech-valid 100 \\
        --nonspeech-test 600 --synthesis-seconds 250 --total-minutes 8.6 --reserve 45   # one ~8.5-min device call
    python benchmarks/train_speech_gpu.py mix --out /tmp/mix --six 900 --natural 900 --joined 250   # a CPU-sized set
    python benchmarks/train_speech_gpu.py prepare --task /tmp/tiny --utterances 200 --valid 50 --test 50
    python benchmarks/train_speech_gpu.py run --task /tmp/tiny --out /tmp/sp --data /tmp/spdata --epochs 1 \\
        --device cpu --workers 2 --shard-size 50                       # the same path, tiny, on a CPU
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / ".speechdebs"
DEBS = ("espeak-ng", "espeak-ng-data", "libespeak-ng1", "libsonic0")
"""espeak-ng's dependencies (``apt-cache depends``) but libpcaudio0, which the stub replaces."""
WHEELS = {"numpy": "numpy", "soundfile": "soundfile", "_cffi_backend": "cffi", "pycparser": "pycparser",
          "soxr": "soxr", "safetensors": "safetensors", "tqdm": "tqdm"}
"""Module → the wheel that brings it, unpacked on the device only when the module is missing."""
PCAUDIO_STUB = r"""
/* libpcaudio's API with no device behind it: espeak-ng --stdout links it but never opens audio. */
#include <stddef.h>
#include <stdint.h>
struct audio_object;
struct audio_object *create_audio_device_object(const char *d, const char *a, const char *s) { return NULL; }
int audio_object_open(struct audio_object *o, int format, uint32_t rate, uint8_t channels) { return -1; }
void audio_object_close(struct audio_object *o) {}
void audio_object_destroy(struct audio_object *o) {}
int audio_object_write(struct audio_object *o, const void *data, size_t bytes) { return -1; }
int audio_object_drain(struct audio_object *o) { return 0; }
int audio_object_flush(struct audio_object *o) { return 0; }
const char *audio_object_strerror(struct audio_object *o, int error) { return "no audio device (stub)"; }
"""


def prepare(args: argparse.Namespace) -> None:
    """Fill .speechdebs/ here: the task's pairs as TSV files (generating them needs babel and num2words,
    which the device lacks), .deb files, the stub library, cp312 wheels.

    train.tsv and valid.tsv mix the generator's six styles with natural phrasings (``train/natural.py``),
    shuffled together; test.tsv is today's held-out set (valid and test are drawn first from the task's
    seeded stream, so ``--test 1000`` gives the same 1,000 pairs whatever the other sizes); natural.tsv
    holds natural phrasings that no other file holds, read only by the held-out voices. ``--joined``
    adds training clips of two or three training sentences in turn (``speech_data.JOIN``)."""
    import random

    from s2s_deploy.train.natural import natural_pairs
    from s2s_deploy.train.speech_data import JOIN
    from s2s_deploy.train.tasks import Pair, SplitSizes, load_task

    splits = load_task("en-fr", 0, SplitSizes(train=args.utterances, valid=500, test=args.test))
    generated = [*splits.train, *splits.valid, *splits.test]
    natural = natural_pairs("en-fr", args.natural_valid + args.natural_test + args.natural, 0,
                            exclude=frozenset(pair.source for pair in generated))
    held_valid = args.natural_valid + args.natural_test
    pool = [*splits.train, *natural[held_valid:]]
    rng = random.Random("prepare/joined")
    joined = []
    for _ in range(args.joined):  # 2-3 sentences read in turn: what a window of a long clip holds
        parts = rng.sample(pool, rng.choice((2, 2, 3)))
        joined.append(Pair(JOIN.join(p.source for p in parts), JOIN.join(p.target for p in parts)))
    files = {
        "train": [pair for pair in splits.train for _ in range(args.copies)] + natural[held_valid:] + joined,
        "valid": list(splits.valid[: args.valid]) + natural[: args.natural_valid],
        "test": list(splits.test),
        "natural": natural[args.natural_valid : held_valid],
    }
    task = Path(args.task)
    task.mkdir(parents=True, exist_ok=True)
    for split, pairs in files.items():
        if split in ("train", "valid"):  # each copy of a pair is read by a voice of its own
            random.Random(f"prepare/{split}").shuffle(pairs)
        (task / f"{split}.tsv").write_text("".join(f"{p.source}\t{p.target}\n" for p in pairs), encoding="utf-8")
        print(f"{task / split}.tsv: {len(pairs)} pairs")
    (KIT / "debs").mkdir(parents=True, exist_ok=True)
    subprocess.run(["apt-get", "download", *DEBS], cwd=KIT / "debs", check=True)
    (KIT / "lib").mkdir(exist_ok=True)
    source = KIT / "lib" / "pcaudio_stub.c"
    source.write_text(PCAUDIO_STUB)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wl,-soname,libpcaudio.so.0", "-o",
                    str(KIT / "lib" / "libpcaudio.so.0"), str(source)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--no-deps",
                    "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3",
                    "--abi", "none", "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64",
                    "--platform", "any", "-d", str(KIT / "wheels"), *sorted(set(WHEELS.values()))], check=True)
    size = sum(p.stat().st_size for p in KIT.rglob("*") if p.is_file())
    print(f"{KIT}: {size / 2**20:.1f} MiB")


def mix(args: argparse.Namespace) -> None:
    """A smaller task folder from the kit's (no network): ``--six`` pairs of the generator's styles and
    ``--natural`` natural phrasings from its train.tsv, ``--joined`` clips of 2-3 of those read in turn,
    and a valid.tsv of ``--valid-six`` and ``--valid-natural`` pairs of its valid.tsv. The held-out files
    (test.tsv, natural.tsv) are not copied: the fine-tune scores nothing it would synthesise first, and
    its natural phrasings stay those ``prepare`` kept apart from natural.tsv. A pair is of the six styles
    when the task's seeded stream (``--utterances``, as ``prepare`` was given) holds it."""
    import random

    from s2s_deploy.train.speech_data import JOIN
    from s2s_deploy.train.tasks import Pair, SplitSizes, load_task, read_tsv

    kit = Path(args.kit)
    splits = load_task("en-fr", 0, SplitSizes(train=args.utterances, valid=500, test=1000))
    styles = {(p.source, p.target) for p in [*splits.train, *splits.valid]}
    chosen: dict[str, list[Pair]] = {}
    for split, six, natural in (("train", args.six, args.natural), ("valid", args.valid_six, args.valid_natural)):
        pairs = read_tsv(kit / f"{split}.tsv")
        generated = [p for p in pairs if (p.source, p.target) in styles]
        said = [p for p in pairs if (p.source, p.target) not in styles]
        if len(generated) < six or len(said) < natural:
            raise SystemExit(f"error: {kit}/{split}.tsv holds {len(generated)} six-style and {len(said)} natural "
                             f"pairs; asked for {six} and {natural}")
        chosen[split] = generated[:six] + said[:natural]
    rng = random.Random("mix/joined")
    pool = list(chosen["train"])
    for _ in range(args.joined):
        parts = rng.sample(pool, rng.choice((2, 2, 3)))
        chosen["train"].append(Pair(JOIN.join(p.source for p in parts), JOIN.join(p.target for p in parts)))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for split, pairs in chosen.items():
        random.Random(f"mix/{split}").shuffle(pairs)
        (out / f"{split}.tsv").write_text("".join(f"{p.source}\t{p.target}\n" for p in pairs), encoding="utf-8")
        print(f"{out / split}.tsv: {len(pairs)} pairs")


def _extract_deb(deb: Path, prefix: Path) -> None:
    """``dpkg -x``, or the same by hand (an ar archive holding data.tar.*) where dpkg is missing."""
    if shutil.which("dpkg"):
        subprocess.run(["dpkg", "-x", str(deb), str(prefix)], check=True)
        return
    data = deb.read_bytes()
    offset = 8  # "!<arch>\n", then 60-byte member headers
    while offset < len(data):
        name, size = data[offset:offset + 16].decode().strip().rstrip("/"), int(data[offset + 48:offset + 58])
        body = data[offset + 60:offset + 60 + size]
        if name.startswith("data.tar"):
            import io

            with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                tar.extractall(prefix, filter="tar")
            return
        offset += 60 + size + size % 2
    raise SystemExit(f"error: {deb} holds no data.tar")


def setup_espeak(prefix: Path) -> None:
    """espeak-ng from the .deb files in a private prefix (even where one is installed: the same build
    everywhere); PATH, LD_LIBRARY_PATH and ESPEAK_DATA_PATH set."""
    debs = sorted((KIT / "debs").glob("*.deb"))
    if not debs:
        raise SystemExit(f"error: no .deb files in {KIT / 'debs'}: run `python {__file__} prepare` first")
    for deb in debs:
        _extract_deb(deb, prefix)
    lib = prefix / "usr" / "lib" / "x86_64-linux-gnu"
    shutil.copy(KIT / "lib" / "libpcaudio.so.0", lib / "libpcaudio.so.0")
    os.environ["PATH"] = f"{prefix / 'usr' / 'bin'}:{os.environ['PATH']}"
    os.environ["LD_LIBRARY_PATH"] = f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}"
    os.environ["ESPEAK_DATA_PATH"] = str(lib / "espeak-ng-data")


def setup_python(prefix: Path) -> None:
    """Missing modules from the carried wheels; the repository and its plugins on the path."""
    import importlib.util

    site = prefix / "python"
    site.mkdir(parents=True, exist_ok=True)
    for module, wheel in WHEELS.items():
        if importlib.util.find_spec(module) is None:
            found = sorted((KIT / "wheels").glob(f"{wheel}-*.whl"))
            if not found:
                raise SystemExit(f"error: {module} is missing and .speechdebs/wheels has no {wheel} wheel")
            with zipfile.ZipFile(found[-1]) as archive:
                archive.extractall(site)
            print(f"unpacked {found[-1].name}", flush=True)
    plugins = site / "s2s_deploy_plugins"
    if plugins.is_symlink() and plugins.readlink() != ROOT / "plugins":  # another checkout's, maybe gone
        plugins.unlink()
    if not plugins.exists():
        plugins.symlink_to(ROOT / "plugins")
    sys.path[:0] = [str(ROOT), str(site)]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(site), os.environ.get("PYTHONPATH", "")])


def run(args: argparse.Namespace) -> None:
    began = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_file = open(out / "train_speech.log", "a", encoding="utf-8")  # noqa: SIM115 (open for the whole run)

    def log(line: str) -> None:
        line = f"[{time.perf_counter() - began:6.0f} s] {line}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    global KIT
    KIT = Path(args.kit)
    prefix = Path(args.prefix)
    setup_espeak(prefix)
    setup_python(prefix)
    import torch

    from s2s_deploy.architecture.registry import REGISTRY
    from s2s_deploy.train.speech import train_speech
    from s2s_deploy.train.speech_data import Augment, SpeechDataConfig, espeak_version, make_speech_data
    from s2s_deploy.train.tasks import read_tsv
    from s2s_deploy.train.trainer import TrainConfig
    from s2s_deploy_plugins.speech import PLUGIN

    REGISTRY.register(PLUGIN, "entry point s2s_deploy_plugins.speech:PLUGIN")
    log(f"{espeak_version()}; torch {torch.__version__}, cuda {torch.cuda.is_available()}; {os.cpu_count()} cores")
    data = Path(args.data)
    task = Path(args.task)
    if not (task / "train.tsv").is_file():
        raise SystemExit(f"error: no {task}/train.tsv: run `python {__file__} prepare` first")
    sizes = {split: len(read_tsv(task / f"{split}.tsv")) for split in ("train", "valid", "test", "natural")
             if (task / f"{split}.tsv").is_file()}
    augment = Augment(speech=args.effects, nonspeech={"train": args.nonspeech_train, "valid": args.nonspeech_valid,
                                                      "nonspeech": args.nonspeech_test}, offset=args.offset)
    config = SpeechDataConfig(task=str(task), sizes=sizes, shard_size=args.shard_size, augment=augment)
    deadline = None if args.synthesis_seconds is None else time.perf_counter() + args.synthesis_seconds
    metadata = make_speech_data(data, config, report=log, workers=args.workers, deadline=deadline)
    shutil.copy(data / "metadata.json", out / "speechdata-metadata.json")
    made = {split: sum(shard["count"] for shard in record["shards"]) for split, record in metadata["splits"].items()}
    log(f"speech data ready: {made}")
    cfg = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, warmup_steps=args.warmup,
                      seed=0, threads=min(os.cpu_count() or 1, 16), device=args.device)
    command = " ".join(sys.argv)
    budget = args.total_minutes * 60 - (time.perf_counter() - began) - args.reserve
    if budget < 30:
        raise SystemExit(f"error: {budget:.0f} s left to train; give more --total-minutes or fewer --utterances")
    log(f"training for at most {budget:.0f} s")
    result = train_speech(PLUGIN, PLUGIN.preset(args.preset), data, cfg, out / "speech.safetensors",
                          info={"command": command, "preset": args.preset}, time_limit=budget, init=args.init,
                          every_epoch=args.every_epoch, log=log)
    size = (out / "speech.safetensors").stat().st_size
    log(f"wrote speech.safetensors ({size / 2**20:.2f} MiB), epoch {result.best_epoch}: valid {result.best.summary()}")
    if result.test is not None:
        log(f"held-out voices: {result.test.summary()}")
    log(f"done in {time.perf_counter() - began:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    ready = commands.add_parser("prepare", help="fill .speechdebs/ (here, with network)")
    ready.add_argument("--utterances", type=int, default=16000, help="training utterances")
    ready.add_argument("--valid", type=int, default=500, help="valid pairs of the generator's styles (at most 500)")
    ready.add_argument("--natural", type=int, default=0, help="training pairs in natural phrasings")
    ready.add_argument("--natural-valid", type=int, default=0, help="valid pairs in natural phrasings")
    ready.add_argument("--joined", type=int, default=0,
                       help="training clips of 2-3 training sentences read in turn with pauses between (the windows "
                            "of a long clip), the target their targets joined by a space")
    ready.add_argument("--natural-test", type=int, default=0,
                       help="held-out natural phrasings (natural.tsv), read only by the held-out voices")
    ready.add_argument("--test", type=int, default=1000, help="held-out-voice utterances scored at the end")
    ready.add_argument("--copies", type=int, default=1,
                       help="readings of each training pair, each by its own voice, speed and pitch")
    blend = commands.add_parser("mix", help="a smaller task folder from the kit's train and valid pairs (no network)")
    blend.add_argument("--out", required=True, help="the new task folder (train.tsv, valid.tsv)")
    blend.add_argument("--kit", default=str(KIT / "task-en-fr"), help="the task folder prepare wrote")
    blend.add_argument("--utterances", type=int, default=6000, help="the --utterances prepare was given")
    blend.add_argument("--six", type=int, default=2000, help="training pairs of the generator's six styles")
    blend.add_argument("--natural", type=int, default=2000, help="training pairs in natural phrasings")
    blend.add_argument("--joined", type=int, default=500, help="training clips of 2-3 of the chosen pairs in turn")
    blend.add_argument("--valid-six", type=int, default=150)
    blend.add_argument("--valid-natural", type=int, default=150)
    go = commands.add_parser("run", help="synthesise, train and score (on the device)")
    go.add_argument("--out", required=True, help="folder for speech.safetensors and train_speech.log")
    go.add_argument("--data", default="/tmp/s2s-speechdata", help="dataset folder (a rerun resumes it)")
    go.add_argument("--prefix", default="/tmp/s2s-speechkit", help="where espeak-ng and missing wheels unpack")
    go.add_argument("--shard-size", type=int, default=250)
    go.add_argument("--effects", type=float, default=0.0,
                    help="share of train and valid speech given one effect (gain, noise, 8 kHz band, DC, echo)")
    go.add_argument("--offset", type=float, default=0.0,
                    help="share of train and valid speech that starts 0.3-3 s into the window (Augment.offset)")
    go.add_argument("--nonspeech-train", type=int, default=0, help="non-speech clips (empty target) in train")
    go.add_argument("--nonspeech-valid", type=int, default=0, help="non-speech clips in valid")
    go.add_argument("--nonspeech-test", type=int, default=0, help="held-out non-speech clips (the nonspeech split)")
    go.add_argument("--synthesis-seconds", type=float, default=None,
                    help="stop waiting for train shards after this many seconds of synthesis (the scored splits "
                         "are made first and always whole); training uses the shards made")
    go.add_argument("--workers", type=int, default=16, help="synthesis processes")
    go.add_argument("--preset", default="small")
    go.add_argument("--epochs", type=int, default=60)
    go.add_argument("--total-minutes", type=float, default=9.0,
                    help="wall-clock budget of the whole run; training gets what synthesis leaves")
    go.add_argument("--reserve", type=float, default=75.0,
                    help="seconds kept for the last validation and the held-out test after training")
    go.add_argument("--batch-size", type=int, default=64)
    go.add_argument("--lr", type=float, default=1.5e-3)
    go.add_argument("--warmup", type=int, default=400)
    go.add_argument("--device", default="cuda")
    go.add_argument("--every-epoch", action="store_true",
                    help="also keep each epoch's weights (speech-epochN.safetensors), not only the best by valid")
    go.add_argument("--init", default=None,
                    help="start from this checkpoint's weights (same architecture and vocabularies), "
                         "e.g. plugins/checkpoints/speech.safetensors")
    go.add_argument("--kit", default=str(KIT), help="the folder prepare filled [default: ROOT/.speechdebs]")
    for command in (ready, go):
        command.add_argument("--task", default=None,
                             help="train/valid/test.tsv, written by prepare, read by run [default: KIT/task-en-fr]")
    args = parser.parse_args()
    if args.command == "mix":
        return mix(args)
    args.task = args.task or str(Path(getattr(args, "kit", KIT)) / "task-en-fr")
    prepare(args) if args.command == "prepare" else run(args)


if __name__ == "__main__":
    main()
