"""Ray: the same bytes as one machine, errors in input order, and resuming across the two."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from s2s_deploy.errors import S2SError
from s2s_deploy.format.manifest import load_manifest
from s2s_deploy.jobs.files import FileOptions, translate_file
from s2s_deploy.runtime.decoding import resolve
from s2s_deploy.runtime.translator import Translator

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 's2s-deploy[ray]'")

from s2s_deploy.jobs.distributed import translate_dataset  # noqa: E402

MAX_LEN = 12
CHUNK = 8


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


def lines_of(manifest, count: int) -> list[str]:
    samples = list(manifest.samples)
    return ["" if i % 9 == 4 else samples[i % len(samples)] for i in range(count)]


def file_options(export: Path, **changes) -> FileOptions:
    search = resolve(load_manifest(export), {"max_len": MAX_LEN})
    return FileOptions(search=search, batch_size=4, chunk_lines=CHUNK, **changes)


def single_machine(export: Path, source: Path, out: Path, **changes) -> bytes:
    translate_file(Translator(export, device="cpu", threads=1), str(source), str(out), file_options(export, **changes),
                   progress=False)
    return out.read_bytes()


def on_ray(export: Path, source: Path, out: Path, resume: bool = False, **changes) -> None:
    translate_dataset(export, source, out, file_options(export, **changes), actors=2, device="cpu", progress=False,
                      resume=resume)


def test_ray_output_equals_single_machine(exports, local_ray, tmp_path: Path) -> None:
    _, manifest = exports.get("gru")
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines_of(manifest, 45)) + "\n", encoding="utf-8")
    on_ray(manifest.directory, source, tmp_path / "ray.txt")
    expected = single_machine(manifest.directory, source, tmp_path / "one.txt")
    assert (tmp_path / "ray.txt").read_bytes() == expected
    assert len(expected.splitlines()) == 45


def test_ray_error_in_order_then_resume(exports, local_ray, tmp_path: Path) -> None:
    _, manifest = exports.get("gru")
    source = tmp_path / "in.txt"
    source.write_bytes("\n".join(lines_of(manifest, 30)).encode() + b"\nbad\xfe\n" + b"end\n")
    out = tmp_path / "ray.txt"
    with pytest.raises(S2SError, match=r"input line 31 is not valid UTF-8"):
        on_ray(manifest.directory, source, out)
    assert not out.exists() and (tmp_path / "ray.txt.part").read_bytes().count(b"\n") == 24
    on_ray(manifest.directory, source, out, errors="replace", resume=True)
    assert out.read_bytes() == single_machine(manifest.directory, source, tmp_path / "one.txt", errors="replace")


def test_ray_noise_shows_only_when_the_run_fails(capfd) -> None:
    from s2s_deploy.jobs.distributed import ray_noise_held_back

    with ray_noise_held_back() as own:
        os.write(2, b"core_worker.cc: noise\n")
        print("progress", file=own)
    assert capfd.readouterr().err == "progress\n"
    with pytest.raises(S2SError), ray_noise_held_back():
        os.write(2, b"core_worker.cc: the cause\n")
        raise S2SError("failed")
    assert capfd.readouterr().err == "core_worker.cc: the cause\n"


def test_a_successful_ray_run_prints_only_its_summary(exports, tmp_path: Path) -> None:
    """The real command in a fresh process, where Ray's own warnings would reach the terminal."""
    _, manifest = exports.get("gru")
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines_of(manifest, 6)) + "\n", encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "s2s_deploy", "translate", str(manifest.directory), "--input",
                             str(source), "--output", str(tmp_path / "out.txt"), "--ray", "--actors", "1",
                             "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [line for line in result.stderr.splitlines()
                                          if line.startswith("translated 6 lines to ")]
    assert len(result.stderr.splitlines()) == 1
