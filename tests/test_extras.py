"""The install split: the runtime and tools never import torch, and a missing extra is named in one line."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from s2s_deploy.cli import extras, main

PACKAGE = Path(__file__).resolve().parents[1] / "s2s_deploy"
TORCH_SIDE = ("torch", "onnxscript", "safetensors", "s2s_deploy.export", "s2s_deploy.train")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


TORCH_FREE = ("architecture", "format", "runtime", "frontends", "transforms", "jobs", "pictures", "serve",
              "web")  # cli: lazily


@pytest.mark.parametrize("folder", TORCH_FREE)
def test_torch_free_folders_import_nothing_from_the_torch_side(folder: str) -> None:
    offending = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in (PACKAGE / folder).rglob("*.py")
        for name in imported_modules(path)
        if any(name == side or name.startswith(side + ".") for side in TORCH_SIDE)
    }
    assert not offending


def test_tools_and_cli_import_without_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "import s2s_deploy.cli, s2s_deploy.transforms.fuse, s2s_deploy.transforms.quantize\n"
            "import s2s_deploy.pictures.attention, s2s_deploy.jobs.files, s2s_deploy.format.manifest\n"
            "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_require_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    hint = r'`s2s-deploy export` needs torch.*pip install "s2s-deploy\[export\]"'
    with pytest.raises(extras.MissingExtra, match=hint):
        extras.require("export", "eval", "export")


def test_require_names_everything_missing_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """`train` without its extra names [train], not [export] and then [eval] on the next try."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("torch", "sacrebleu") else real(name, *a))
    with pytest.raises(extras.MissingExtra, match=r'needs torch, sacrebleu, which are .*"s2s-deploy\[train\]"$'):
        extras.require("train", "export", "eval", bundle="train")
    with pytest.raises(extras.MissingExtra, match=r'"s2s-deploy\[plot,export\]"$'):
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: None if name in ("torch", "matplotlib") else real(name, *a))
        extras.require("attention", "plot", "export")


def test_bench_of_the_runtime_needs_no_torch(exports) -> None:
    """`bench --systems onnxruntime-cpu` measures the torch-free runtime, so it must run without torch."""
    _, manifest = exports.get("gru")
    code = ("import sys; sys.modules['torch'] = None\nfrom s2s_deploy.cli import main\n"
            f"main(['bench', {str(manifest.directory)!r}, '--systems', 'onnxruntime-cpu', '--reps', '1', "
            "'--warmup', '0', '--beams', '1', '--batches', '1', '--sentences', '2'])\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "onnxruntime-cpu" in result.stdout


def test_every_extra_module_is_declared_in_pyproject() -> None:
    import tomllib

    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    declared = pyproject["project"]["optional-dependencies"]
    for extra, modules in extras.EXTRA_MODULES.items():
        requirements = " ".join(declared[extra]).lower()
        for module in modules:
            assert module.replace("_", "-") in requirements, (extra, module)


def test_a_missing_module_past_require_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    @main.command("needs-ray-test", hidden=True)
    def needs_ray() -> None:
        raise ModuleNotFoundError("No module named 'ray'", name="ray")

    try:
        result = CliRunner().invoke(main, ["needs-ray-test"])
    finally:
        main.commands.pop("needs-ray-test")
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        'error: `s2s-deploy needs-ray-test` needs ray, which is not installed: pip install "s2s-deploy[ray]"'
    ]


def test_two_onnxruntime_wheels_are_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch, exports) -> None:
    _, manifest = exports.get("gru")

    def distribution(name: str):
        if name in ("onnxruntime", "onnxruntime-gpu"):
            return object()
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(extras.metadata, "distribution", distribution)
    result = CliRunner().invoke(main, ["translate", str(manifest.directory), "x"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu" in lines[0]
    assert CliRunner().invoke(main, ["list"]).exit_code == 0


def test_cpu_runs_print_no_device_notice_unless_verbose(exports) -> None:
    _, manifest = exports.get("gru")
    text = manifest.samples[0]
    plain = CliRunner().invoke(main, ["translate", str(manifest.directory), text, "--device", "cpu"])
    assert plain.exit_code == 0 and plain.stderr == ""
    verbose = CliRunner().invoke(main, ["--verbose", "translate", str(manifest.directory), text, "--device", "cpu"])
    assert verbose.exit_code == 0 and "CPUExecutionProvider" in verbose.stderr
    assert verbose.stdout == plain.stdout


def test_quiet_needs_no_output_file(exports) -> None:
    _, manifest = exports.get("gru")
    result = CliRunner().invoke(main, ["--verbose", "translate", str(manifest.directory), manifest.samples[0],
                                       "--quiet"])
    assert result.exit_code == 0 and result.stderr == "" and result.stdout.strip()


def test_every_command_group_module_is_loaded() -> None:
    assert isinstance(main, click.Group)
    assert {"export", "translate", "parity", "train", "evaluate", "bench", "fuse", "quantize", "inspect",
            "attention", "list"} <= set(main.commands)
