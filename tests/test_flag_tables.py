"""The flag tables of ``docs/methods/*.md`` are today's code's (``dev/flag_tables.py --check``), and every default a
help text states is the code's: for each arch the package registers, the value after the arch function (fairseq's
``ARCH_CONFIG_REGISTRY``) on a command line that does not give the flag; for each task, criterion and optimizer
config, the dataclass field's default."""

import argparse
import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = importlib.util.spec_from_file_location("flag_tables", os.path.join(ROOT, "dev", "flag_tables.py"))
flag_tables = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(flag_tables)
REG = flag_tables.load_registries()

# what a help text may say a default is: "(default X", "(default: X", "; default X", ", default: X" (X up to the next
# , ; : or closing parenthesis), "'X' (default", read as the flag's value; and for a flag with choices, a choice named
# without quotes just before "(default" or before a parenthesis ending in "; default)" ("cnn (the authors'; default)")
STATED = (
    re.compile(r"\(default:?\s+([^,;:)]+)"),
    re.compile(r"[;,]\s*default:?\s+([^,;:)]+)"),
    re.compile(r"'([^']+)' \(default\b"),
)
CHOICE_STATED = (re.compile(r"'?([\w.*:-]+)'? \(default\b"), re.compile(r"'?([\w.*:-]+)'? \([^()]*[;,]\s*default\)"))
# defaults stated in words, each with the value the code has for it (None: unset, filled from what the words name)
IN_WORDS = {
    ("--eki-scaling-dropout", "the model's --dropout"): None,
    ("--cocon-lm-dict", "dict.txt beside it"): None,
    ("--cocon-layer", "round(7/24 x layers"): None,
    ("--cocon-attention-heads", "the LM's"): None,
    ("--kg-keep-source-facts", "skip"): False,
    ("--kg-every-mention", "its first mention only"): False,
}
UNREADABLE = object()


def one_line(text):
    return " ".join((text or "").split())


def stated_defaults(help_text):
    """The defaults a help text states with :data:`STATED` (strings, as written)."""
    return [m.group(1).strip() for pattern in STATED for m in pattern.finditer(one_line(help_text))]


def convert(action, stated):
    """``stated`` through the flag's type (store_true: off/on), or :data:`UNREADABLE`."""
    if isinstance(action, argparse._StoreTrueAction):
        return {"off": False, "on": True}.get(stated, UNREADABLE)
    if action.type in (None, str):
        return stated
    try:
        return action.type(stated)
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return UNREADABLE


def stated_values(action, flag):
    """(as written, the value it stands for) of every default the flag's help states. A default read by
    :data:`STATED` must be a value of the flag, or be in :data:`IN_WORDS`; one read by :data:`CHOICE_STATED`
    counts when it is one of the flag's choices (the words before a parenthesis are often no value)."""
    out = []
    for stated in stated_defaults(action.help):
        value = IN_WORDS[flag, stated] if (flag, stated) in IN_WORDS else convert(action, stated)
        if value is UNREADABLE or (action.choices and value not in action.choices):
            pytest.fail(f"{flag}: the help states the default {stated!r}, no value of the flag (or put it in IN_WORDS)")
        out.append((stated, value))
    if action.choices:
        for pattern in CHOICE_STATED:
            for m in pattern.finditer(one_line(action.help)):
                value = convert(action, m.group(1))
                if value is not UNREADABLE and value in action.choices and (m.group(1), value) not in out:
                    out.append((m.group(1), value))
    return out


def package_archs():
    return [a for a, cls in REG["arch_model"].items() if flag_tables.ours(cls)]


def package_configs():
    kinds = ("task", "criterion", "optimizer")
    return [(kind, name) for kind in kinds for name, c in REG[kind].items() if c and flag_tables.ours(c)]


def test_the_pages_flag_tables_are_the_code_s():
    """``dev/flag_tables.py --check``: each page's tables are what the generator builds from today's code."""
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "dev", "flag_tables.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("arch", package_archs())
def test_model_help_texts_state_the_arch_s_defaults(arch):
    """Every "(default X)" of a flag the model adds equals the flag's value after the arch function (for an option
    the arch leaves to the decoder, which fills it only with another flag: its value with that flag)."""
    cls = REG["arch_model"][arch]
    for action in flag_tables.own_model_actions(cls):
        flag = max(action.option_strings, key=len)
        for stated, expected in stated_values(action, flag):
            value, _ = flag_tables.model_default(REG, arch, action.dest)
            if isinstance(action, argparse._StoreTrueAction) and value is None:
                value = False
            assert value == expected, f"--arch {arch}: {flag}'s help says default {stated!r}, the code has {value!r}"


@pytest.mark.parametrize("kind, name", package_configs())
def test_config_help_texts_state_the_field_defaults(kind, name):
    """Every "(default X)" in a task's, criterion's or optimizer's field help equals the field's default."""
    cfg_cls = REG[kind][name]
    actions = flag_tables.dataclass_actions(cfg_cls)
    instance = cfg_cls()
    for field_name, action in actions.items():
        if field_name.startswith("_") or not action.option_strings:
            continue
        flag = max(action.option_strings, key=len)
        for stated, expected in stated_values(action, flag):
            default = instance._get_default(field_name)
            default = getattr(default, "value", default)
            said = f"{kind} {name}: {flag}'s help says default {stated!r}"
            assert default == expected, f"{said}, the field has {default!r}"


def test_the_patterns_read_the_forms_the_help_texts_use():
    assert stated_defaults("layer (default -1: last)") == ["-1"]
    assert stated_defaults("x (default: off, no copy parameters)") == ["off"]
    assert stated_defaults("dydim only (default 2*sqrt, 2 sqrt(x+1); a warning)") == ["2*sqrt"]
    assert stated_defaults("E_D (Eq. 3; default 1)") == ["1"]
    assert stated_defaults("the block sits after L; default: round(7/24 x layers), the authors'") == [
        "round(7/24 x layers"
    ]
    parser = argparse.ArgumentParser()
    a = parser.add_argument("--a", choices=["all", "list", "cnn", "mlp"])
    for text, value in [("'all' (default) or a list", "all"), ("cnn (the authors', pooled; default) or mlp", "cnn")]:
        a.help = text
        assert stated_values(a, "--a") == [(value, value)]
    a.help = "on 'token' ids (default; the paper's) or on 'list's"  # "ids" is no choice: nothing stated
    assert stated_values(a, "--a") == []
