"""What a newcomer meets in the first hour: the quick start twice, help, messages and labels."""

from __future__ import annotations

import click
from click.testing import CliRunner

from s2s_deploy.cli import main


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_unchanged_re_export_is_up_to_date(exports) -> None:
    """The README's quick start run twice: the second export finds the same thing and succeeds."""
    _, manifest = exports.get("gru")
    before = (manifest.directory / "manifest.json").read_bytes()
    code, out, err = run("export", "--arch", "gru", "--out", str(manifest.directory))
    assert code == 0, err
    assert "up to date" in out
    assert (manifest.directory / "manifest.json").read_bytes() == before


def test_manifest_names_the_checkpoint_without_its_path(exports) -> None:
    source, manifest = exports.get("gru")
    recorded = manifest.raw["source"]
    assert str(source.checkpoint_path.parent) not in recorded
    assert source.checkpoint_path.name in recorded and manifest.raw["checkpoint"]["sha256"] in recorded


def _commands() -> list[click.Command]:
    return [main, *main.commands.values()]


def test_top_level_help_shows_whole_summaries() -> None:
    code, out, _ = run("--help")
    assert code == 0
    assert "..." not in out.split("Commands:")[1]
    for name, command in main.commands.items():
        summary = command.get_short_help_str(limit=60)
        assert not summary.endswith("...") and f"  {summary}" in out, name


def test_every_option_has_help() -> None:
    missing = [f"{command.name} {param.opts[0]}" for command in _commands() for param in command.params
               if isinstance(param, click.Option) and not (param.help or "").strip()]
    assert missing == []
