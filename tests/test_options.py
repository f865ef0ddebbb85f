"""One registry of options: the parser, `vllm-load options` and the options table (docs/options.md) agree."""

from __future__ import annotations

import re

from tests.helpers import ROOT
from vllm_load.cli import main as cli_main
from vllm_load.options import OPTIONS


def documented_option_flags() -> set[str]:
    table = (ROOT / "docs" / "options.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| `--")]
    return {flag for row in rows for flag in re.findall(r"`(--[a-z0-9-]+)`", row.split("|")[1])}


def test_the_options_table_lists_every_option_and_no_other():
    registry = {o.flag for o in OPTIONS}
    documented = documented_option_flags()
    assert registry - documented == set(), "options missing from docs/options.md's table"
    assert documented - registry == set(), "docs/options.md's table names options that do not exist"


def test_the_docs_table_is_the_registrys_as_vllm_load_options_markdown_writes_it(capsys):
    """docs/options.md's table is generated from the registry (one definition of each option): a changed default or
    meaning in vllm_load/options.py fails here until `vllm-load options --markdown` is written into the docs."""
    from vllm_load.option_docs import MARKDOWN_BEGIN, MARKDOWN_END, markdown

    text = (ROOT / "docs" / "options.md").read_text()
    assert text.count(MARKDOWN_BEGIN) == text.count(MARKDOWN_END) == 1  # it once ended with its end marker 4 times
    generated = text[text.index(MARKDOWN_BEGIN):text.index(MARKDOWN_END) + len(MARKDOWN_END)]
    assert cli_main(["options", "--markdown"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == markdown() == generated
    # what a reader finds in it: a switch reads off, a group's heading, a shown default, a locustfile's option
    assert "| `--insecure` | `off` |" in generated and "### Load shape" in generated
    assert "| `--output-tokens` | `64` |" in generated and "env `VLLM_LOAD_TURNS`" in generated


def test_vllm_load_options_prints_every_option_with_its_env_and_default(capsys):
    assert cli_main(["options"]) == 0
    out = capsys.readouterr().out
    for o in OPTIONS:
        assert f"{o.flag}  (default: " in out and o.env in out, o.flag
    assert "--input-tokens  (default: 128; env VLLM_LOAD_INPUT_TOKENS)" in out
    assert "--align-with-server  (default: off;" in out


def test_options_are_grouped_each_in_exactly_one_group(capsys):
    from vllm_load.options import GROUPS

    grouped = [f for flags in GROUPS.values() for f in flags]
    assert sorted(grouped) == sorted(o.flag for o in OPTIONS)  # each once, none missing, none invented
    assert cli_main(["options"]) == 0
    out = capsys.readouterr().out
    heads = [g.upper() for g in ("target", "workload", "load shape", "request body", "datasets and traces",
                                 "SLOs and gates", "outputs", "server side", "emulator")]
    positions = [out.index(f"\n{h}\n") if f"\n{h}\n" in out else out.index(f"{h}\n") for h in heads]
    assert positions == sorted(positions)
    # an option's group holds it: --burstiness sits under LOAD SHAPE, before REQUEST BODY
    assert out.index("LOAD SHAPE") < out.index("--burstiness") < out.index("REQUEST BODY")
    assert "--turns  (default: 3; env VLLM_LOAD_TURNS; multiturn.py only)" in out


def test_the_subcommands_help_shows_defaults_descriptions_and_examples(capsys):
    import pytest

    from vllm_load.cli import main as cli_main

    with pytest.raises(SystemExit):
        cli_main(["tune", "--help"])
    tune = capsys.readouterr().out
    assert "(default: 30s)" in tune and "(default: concurrency)" in tune
    assert "example (a --serve'd emulator, tuning its max_num_seqs" in tune and "--grid max_num_seqs=2,4" in tune
    with pytest.raises(SystemExit):
        cli_main(["compare", "--help"])
    compare = capsys.readouterr().out
    assert "What changed from run A to run B" in compare and "the baseline" in compare
    assert cli_main(["options"]) == 0
    listed = capsys.readouterr().out
    assert "hf:PATH" in listed and "--output-tokens  (default: 64;" in listed  # one default, said once
    assert "multiturn.py: the first user message's" in listed  # what each locustfile does with --input-tokens


def test_options_search_finds_by_flag_group_and_meaning(capsys):
    assert cli_main(["options", "--search", "TTFT"]) == 0
    out = capsys.readouterr().out
    assert "--emulator-ttft" in out and "--slo" in out  # by flag, by meaning ('ttft.p99<=500ms')
    assert "--api-key" not in out and "--turns" not in out
    assert cli_main(["options", "--search", "no-such-word"]) == 2
    assert "no option mentions 'no-such-word'" in capsys.readouterr().err
    # a word's start, not inside another word: "rate" is no hit in "generate" or "accurate" (7 of 17 hits were)
    assert cli_main(["options", "--search", "rate"]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("--")}
    assert "--request-rate" in listed and "--sweep-mode" in listed  # "... or 'rate' (open loop ...)"
    assert listed == {o.flag for o in OPTIONS if re.search(r"(?<![a-z0-9])rate", f"{o.group} {o.flag} {o.help}".lower())}
    assert "--output-tokens" not in listed  # its help says "generate", not "rate"


def test_the_web_form_offers_no_option_that_names_a_file():
    """--response-format json_schema:FILE was on the form: a local caller made every request carry any JSON file of
    the machine, learnt its values from the refusal, and exhausted memory with /dev/zero."""
    from vllm_load.options import OPTIONS

    import re

    names_a_file = [o.flag for o in OPTIONS if o.web and (re.search(r"\bFILE\b|\bPATH\b", o.help)
                                                          or o.flag.endswith(("-file", "-plan", "-dir", "-from")))]
    assert names_a_file == [], names_a_file
    assert not next(o for o in OPTIONS if o.flag == "--response-format").web


def test_a_schema_refused_says_its_broken_rule_not_the_files_values(tmp_path):
    import pytest

    from vllm_load.errors import UsageError
    from vllm_load.workload.structured import parse_response_format

    secret = tmp_path / "creds.json"
    secret.write_text('{"type": "sk-live-ORACLE-42"}')
    with pytest.raises(UsageError) as err:
        parse_response_format(f"json_schema:{secret}")
    assert "sk-live-ORACLE-42" not in str(err.value) and "not a JSON schema (at type:" in str(err.value)


def test_an_option_says_its_default_once_where_the_default_is_shown():
    """`vllm-load options` printed `(default: -)` beside a default written in the help (`--run-dir`, `--tokenizer`,
    `--metric-percentiles`): an option whose default is decided later says it in ``shown_default``, never in its
    help."""
    import re

    from vllm_load.options import OPTIONS

    offenders = [o.flag for o in OPTIONS if re.search(r"\(default:|[;,] default:? ", o.help)]
    assert offenders == []
    from vllm_load.option_docs import describe

    text = describe("")
    for flag, shown in (("--run-dir", "reports/<run id>"), ("--tokenizer", "the model name"),
                        ("--metric-percentiles", "50,90,95,99,99.9")):
        assert f"{flag}  (default: {shown};" in text
