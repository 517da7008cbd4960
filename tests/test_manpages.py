"""The manual pages in man/ are checked against the code they document.

* every page renders with groff without a warning and has the standard
  sections, in the standard order;
* every option string of every verb of ``vq_admin.cli.build_parser()`` (and of
  nested verbs, such as ``provider install``) appears in the OPTIONS section
  of that verb's page ``man/vq-admin-<verb>.8``, has an entry there (a
  ``.TP`` tag in the roff source) and is shown in its SYNOPSIS; a verb
  without a page fails, unless it is listed in :data:`PAGES_PENDING`;
* ``vq-admin.8`` documents the global options and names every verb, and its
  SEE ALSO names every page in man/;
* ``vq-admin-agent.8`` documents the scheduler-side helper the same way: every
  verb of ``vq_admin.agent.cli.build_parser()`` has a SYNOPSIS line and a
  COMMANDS entry, every option of a verb is shown on that verb's SYNOPSIS line
  and has an entry (a ``.TP``/``.TQ`` tag) in that verb's subsection
  (``.SS <verb>``) of OPTIONS, and every exit status of the agent has an
  entry in EXIT STATUS;
* ``vq-admin.toml.5`` has an entry for every configuration key of
  ``vq_admin.config`` and its example is a valid configuration;
* the paired docs: ``docs/configuration.md`` names every key,
  ``docs/providers.md`` gives every hook with its exact signature, and
  ``docs/index.md`` links every page of docs/.

Pages are rendered wide (``-rLL=200n``) and without hyphenation
(``-rHY=0``) so option strings stay whole; hyphen look-alikes are folded to
``-`` before comparing.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import os
import re
import shutil
import subprocess
import textwrap
import tomllib
from pathlib import Path

import pytest

from vq_admin import config as vq_config
from vq_admin.agent import cli as agent_cli
from vq_admin.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
MAN_DIR = ROOT / "man"
DOCS_DIR = ROOT / "docs"
OVERVIEW = MAN_DIR / "vq-admin.8"
CONFIG_PAGE = MAN_DIR / "vq-admin.toml.5"

#: Verbs of build_parser() that have no page man/vq-admin-<verb>.8 yet.
#: Whoever adds a verb without writing its page lists it here in the same
#: change, and whoever writes the page removes it.  Keep this set as small as
#: possible (empty is the normal state): a verb listed here whose page exists
#: is checked like any other, and a verb without a page that is not listed
#: fails :func:`test_every_option_of_every_verb_is_on_its_page`.
PAGES_PENDING: frozenset[str] = frozenset()

#: Pages in man/ named vq-admin-* that document another program, not a verb.
OTHER_PROGRAM_PAGES = frozenset({"vq-admin-agent.8"})
#: The page of the scheduler-side helper, checked against vq_admin.agent.cli.
AGENT_PAGE = MAN_DIR / "vq-admin-agent.8"

#: Sections of lesson 10 (notes/style.md), in their order.  Other sections
#: (COMMANDS, OUTPUT, ...) may appear anywhere between them.
CANONICAL_ORDER = ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS", "ENVIRONMENT", "FILES",
                   "EXAMPLES", "SEE ALSO")
REQUIRED_EVERY_PAGE = ("NAME", "SYNOPSIS", "DESCRIPTION", "FILES", "EXAMPLES", "SEE ALSO")
REQUIRED_SECTION_8 = ("EXIT STATUS", "ENVIRONMENT")

_HYPHENS = str.maketrans({"\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2212": "-",
                          "\u00ad": ""})
_HEADING_RE = re.compile(r"\A[A-Z][A-Z0-9 /_.-]*\Z")


def _require_groff() -> None:
    if shutil.which("groff"):
        return
    reason = "groff is not installed (Debian package groff-base; scripts/test.sh installs it)"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set and {reason}", pytrace=False)
    pytest.skip(reason)


def _groff_env() -> dict[str, str]:
    return dict(os.environ, LC_ALL="C.UTF-8", LANG="C.UTF-8")


@functools.lru_cache(maxsize=None)
def render(page: Path) -> str:
    """The page as plain text: wide, unhyphenated, no overstrike or SGR."""
    done = subprocess.run(
        ["groff", "-man", "-Tutf8", "-P-cbou", "-rLL=200n", "-rHY=0", str(page)],
        capture_output=True, text=True, encoding="utf-8", env=_groff_env(), check=False,
    )
    assert done.returncode == 0, f"groff failed on {page.name}: {done.stderr}"
    return done.stdout.translate(_HYPHENS)


@functools.lru_cache(maxsize=None)
def sections(page: Path) -> dict[str, str]:
    """Rendered text per section heading (unindented upper-case lines)."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in render(page).splitlines():
        if line and not line[0].isspace() and _HEADING_RE.match(line.rstrip()):
            current = found.setdefault(line.strip(), [])
            continue
        if current is not None:
            current.append(line)
    return {name: "\n".join(lines) for name, lines in found.items()}


def section_order(page: Path) -> list[str]:
    return list(sections(page))


def has_token(text: str, token: str) -> bool:
    """*token* appears whole: not inside a longer option or word."""
    return re.search(r"(?<![\w-])" + re.escape(token) + r"(?![\w-])", text) is not None


def roff_tags(page: Path, section: str) -> str:
    """The tags (the line after each ``.TP``/``.TQ``) of *section* in the roff
    source, as plain text: what the page presents as its documented terms."""
    lines = page.read_text(encoding="utf-8").splitlines()
    inside, tags = False, []
    for i, line in enumerate(lines):
        if line.startswith(".SH"):
            inside = line[3:].strip().strip('"') == section
        elif inside and line.startswith((".TP", ".TQ")) and i + 1 < len(lines):
            tags.append(_roff_plain(lines[i + 1]))
    return "\n".join(tags)


def _roff_plain(line: str) -> str:
    text = re.sub(r"\A\.[A-Za-z]+[ \t]*", "", line)       # a leading macro: .B, .BR, .BI ...
    text = re.sub(r"\\f(?:[BIRP]|\(..|\[[^]]*\])", "", text)  # font changes
    text = text.replace("\\-", "-").replace("\\&", "").replace('"', " ")
    return text.translate(_HYPHENS)


def pages() -> list[Path]:
    return sorted(p for p in MAN_DIR.iterdir() if re.search(r"\.[1-9]\Z", p.name))


def page_ref(page: Path) -> str:
    """``vq-admin-update.8`` -> ``vq-admin-update(8)``."""
    stem, section = page.name.rsplit(".", 1)
    return f"{stem}({section})"


# -- walking the argument parser ---------------------------------------------------


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Verb -> subparser of *parser* (empty when it has none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [opt for action in parser._actions for opt in action.option_strings]


def verb_tree() -> dict[str, tuple[list[str], list[str]]]:
    """Top-level verb -> (option strings of it and of every nested verb, nested verb paths)."""
    tree: dict[str, tuple[list[str], list[str]]] = {}
    for verb, sub in subcommands(build_parser()).items():
        options: list[str] = []
        nested: list[str] = []
        stack = [((), sub)]
        seen: set[int] = set()
        while stack:
            path, parser = stack.pop()
            if id(parser) in seen:
                continue
            seen.add(id(parser))
            options += [o for o in option_strings(parser) if o not in options]
            for name, child in subcommands(parser).items():
                nested.append(" ".join((*path, name)))
                stack.append(((*path, name), child))
        tree[verb] = (options, nested)
    return tree


def verb_page(verb: str) -> Path:
    return MAN_DIR / f"vq-admin-{verb}.8"


# -- every page --------------------------------------------------------------------


def test_man_directory_has_the_core_pages():
    names = {p.name for p in pages()}
    for required in ("vq-admin.8", "vq-admin-update.8", "vq-admin-status.8", "vq-admin-check.8",
                     "vq-admin-providers.8", "vq-admin.toml.5"):
        assert required in names, f"man/{required} is missing"


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_page_renders_without_warnings(page):
    _require_groff()
    done = subprocess.run(["groff", "-ww", "-z", "-man", str(page)], capture_output=True, text=True,
                          env=_groff_env(), check=False)
    assert done.returncode == 0 and done.stderr == "", f"groff warns about {page.name}:\n{done.stderr}"
    assert render(page).strip(), f"{page.name} renders empty"


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_page_renders_at_80_columns_without_warnings(page):
    """As an operator reads it: ``man`` on an 80-column terminal, with troff's warnings on (a line that cannot
    be adjusted, a path wider than the line)."""
    if not shutil.which("man"):
        pytest.skip("man is not installed (Debian package man-db)")
    done = subprocess.run(["man", "--warnings", "-l", str(page)], capture_output=True, text=True,
                          env=dict(_groff_env(), MANWIDTH="80", MAN_KEEP_FORMATTING="0", PAGER="cat"), check=False)
    assert done.returncode == 0 and done.stderr == "", f"man warns about {page.name} at 80 columns:\n{done.stderr}"
    assert done.stdout.strip(), f"{page.name} renders empty"


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_page_has_the_standard_sections_in_order(page):
    _require_groff()
    present = section_order(page)
    section = page.name.rsplit(".", 1)[1]
    required = list(REQUIRED_EVERY_PAGE) + (list(REQUIRED_SECTION_8) if section == "8" else [])
    if section == "8":
        required.append("OPTIONS")  # every verb has options (--help at least)
    missing = [s for s in required if s not in present]
    assert not missing, f"{page.name} lacks the sections {missing} (has {present})"
    canonical = [s for s in present if s in CANONICAL_ORDER]
    assert canonical == sorted(canonical, key=CANONICAL_ORDER.index), (
        f"{page.name}: sections out of the standard order: {canonical}")


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_page_name_section_names_the_page(page):
    _require_groff()
    stem = page.name.rsplit(".", 1)[0]
    assert has_token(sections(page)["NAME"], stem), f"the NAME section of {page.name} does not name {stem}"


@pytest.mark.parametrize("page", [p for p in pages() if p != OVERVIEW], ids=lambda p: p.name)
def test_page_refers_back_to_the_overview(page):
    _require_groff()
    assert "vq-admin(8)" in sections(page)["SEE ALSO"], f"{page.name}: SEE ALSO does not name vq-admin(8)"


def test_overview_see_also_names_every_page():
    _require_groff()
    see_also = sections(OVERVIEW)["SEE ALSO"]
    missing = [page_ref(p) for p in pages() if p != OVERVIEW and page_ref(p) not in see_also]
    assert not missing, f"vq-admin.8 SEE ALSO does not name {missing}"


# -- pages against the argument parser ---------------------------------------------


def test_overview_documents_the_global_options_and_every_verb():
    _require_groff()
    text = sections(OVERVIEW)
    tags = roff_tags(OVERVIEW, "OPTIONS")
    missing = [o for o in option_strings(build_parser()) if not (has_token(text["OPTIONS"], o) and has_token(tags, o))]
    assert not missing, f"vq-admin.8 OPTIONS has no entry for the global options {missing}"
    assert "COMMANDS" in text, "vq-admin.8 has no COMMANDS section"
    verbs = list(subcommands(build_parser()))
    missing = [v for v in verbs if not has_token(text["COMMANDS"], v)]
    assert not missing, f"vq-admin.8 COMMANDS does not name the verbs {missing}"
    missing = [v for v in verbs if not has_token(text["SYNOPSIS"], v)]
    assert not missing, f"vq-admin.8 SYNOPSIS does not list the verbs {missing}"


@pytest.mark.parametrize("verb", sorted(verb_tree()))
def test_every_option_of_every_verb_is_on_its_page(verb):
    options, nested = verb_tree()[verb]
    page = verb_page(verb)
    if not page.exists():
        if verb in PAGES_PENDING:
            pytest.skip(f"man/{page.name} is pending (PAGES_PENDING)")
        pytest.fail(f"the verb {verb!r} has no manual page man/{page.name} "
                    f"(write it; PAGES_PENDING is only for pages other engineers are writing now)")
    _require_groff()
    text = sections(page)
    assert "OPTIONS" in text, f"{page.name} has no OPTIONS section"
    missing = [o for o in options if not has_token(text["OPTIONS"], o)]
    assert not missing, f"{page.name}: OPTIONS does not document {missing} of 'vq admin {verb}'"
    tags = roff_tags(page, "OPTIONS")
    missing = [o for o in options if not has_token(tags, o)]
    assert not missing, f"{page.name}: OPTIONS has no entry (.TP tag) for {missing} of 'vq admin {verb}'"
    missing = [n for n in nested if not has_token(render(page), n.split()[-1])]
    assert not missing, f"{page.name} does not describe the nested verbs {missing} of 'vq admin {verb}'"
    missing = [o for o in options if o not in ("-h", "--help") and not has_token(text["SYNOPSIS"], o)
               and not has_token(text["SYNOPSIS"], o.split("=")[0])]
    assert not missing, f"{page.name}: SYNOPSIS does not show {missing}"


def test_pages_pending_is_only_for_verbs_without_pages():
    """A verb whose page exists is checked in full; listing it here hides nothing,
    but it should be removed from PAGES_PENDING (this reports which)."""
    stale = sorted(v for v in PAGES_PENDING if verb_page(v).exists())
    assert not stale, f"remove {stale} from PAGES_PENDING: their pages exist now"


def test_every_verb_page_belongs_to_a_verb():
    verbs = set(subcommands(build_parser()))
    orphans = [p.name for p in pages() if p.name.startswith("vq-admin-") and p.name.endswith(".8")
               and p.name not in OTHER_PROGRAM_PAGES and p.name[len("vq-admin-"):-len(".8")] not in verbs]
    assert not orphans, f"pages for verbs build_parser() does not have: {orphans}"


# -- the scheduler-side helper (vq-admin-agent) ----------------------------------------


def agent_verbs() -> dict[str, argparse.ArgumentParser]:
    return subcommands(agent_cli.build_parser())


def roff_subsection_tags(page: Path, section: str) -> dict[str, str]:
    """Subsection (``.SS`` title) -> its tags, as :func:`roff_tags` gives them, within *section*."""
    lines = page.read_text(encoding="utf-8").splitlines()
    inside, current, tags = False, "", {}
    for i, line in enumerate(lines):
        if line.startswith(".SH"):
            inside, current = line[3:].strip().strip('"') == section, ""
        elif inside and line.startswith(".SS"):
            current = _roff_plain(line[3:]).strip()
            tags.setdefault(current, [])
        elif inside and line.startswith((".TP", ".TQ")) and i + 1 < len(lines):
            tags.setdefault(current, []).append(_roff_plain(lines[i + 1]))
    return {name: "\n".join(found) for name, found in tags.items()}


def synopsis_lines(page: Path, program: str) -> dict[str, str]:
    """Verb -> its SYNOPSIS line(s): the text from ``<program> <verb>`` up to the next ``<program>``."""
    text = " ".join(sections(page)["SYNOPSIS"].split())
    found: dict[str, str] = {}
    for chunk in text.split(program + " ")[1:]:
        verb = chunk.split(" ", 1)[0]
        found.setdefault(verb, chunk)
    return found


def test_agent_page_exists_and_is_listed_as_another_program():
    assert AGENT_PAGE.exists(), "man/vq-admin-agent.8 is missing"
    assert AGENT_PAGE.name in OTHER_PROGRAM_PAGES


def test_agent_page_names_every_verb_in_synopsis_and_commands():
    _require_groff()
    text = sections(AGENT_PAGE)
    assert "COMMANDS" in text, "vq-admin-agent.8 has no COMMANDS section"
    verbs = list(agent_verbs())
    missing = [v for v in verbs if v not in synopsis_lines(AGENT_PAGE, "vq-admin-agent")]
    assert not missing, f"vq-admin-agent.8 SYNOPSIS has no line for the verbs {missing}"
    tags = roff_tags(AGENT_PAGE, "COMMANDS")
    missing = [v for v in verbs if not has_token(tags, v)]
    assert not missing, f"vq-admin-agent.8 COMMANDS has no entry (.TP tag) for the verbs {missing}"
    documented = {line.strip().split()[0] for line in tags.splitlines() if line.strip()}
    extra = sorted(documented - set(verbs))
    assert not extra, f"vq-admin-agent.8 COMMANDS documents verbs the agent does not have: {extra}"


@pytest.mark.parametrize("verb", sorted(agent_verbs()))
def test_every_option_of_every_agent_verb_is_on_the_agent_page(verb):
    _require_groff()
    options = option_strings(agent_verbs()[verb])
    text = sections(AGENT_PAGE)
    missing = [o for o in options if not has_token(text["OPTIONS"], o)]
    assert not missing, f"vq-admin-agent.8: OPTIONS does not document {missing} of 'vq-admin-agent {verb}'"
    help_tags = roff_subsection_tags(AGENT_PAGE, "OPTIONS").get("", "")
    missing = [o for o in ("-h", "--help") if o in options and not has_token(help_tags, o)]
    assert not missing, f"vq-admin-agent.8: OPTIONS has no general entry for {missing}"
    own = [o for o in options if o not in ("-h", "--help")]
    subsections = roff_subsection_tags(AGENT_PAGE, "OPTIONS")
    assert verb in subsections or not own, f"vq-admin-agent.8: OPTIONS has no subsection '.SS {verb}'"
    missing = [o for o in own if not has_token(subsections.get(verb, ""), o)]
    assert not missing, f"vq-admin-agent.8: '.SS {verb}' of OPTIONS has no entry (.TP tag) for {missing}"
    line = synopsis_lines(AGENT_PAGE, "vq-admin-agent").get(verb, "")
    missing = [o for o in own if not has_token(line, o)]
    assert not missing, f"vq-admin-agent.8: the SYNOPSIS line of {verb} does not show {missing}"


def test_agent_page_gives_every_exit_status():
    _require_groff()
    codes = sorted({0, agent_cli.EXIT_FAILED, agent_cli.EXIT_USAGE, agent_cli.EXIT_MISMATCH, agent_cli.EXIT_UNSAFE,
                    agent_cli.EXIT_HELD})
    tags = {line.strip() for line in roff_tags(AGENT_PAGE, "EXIT STATUS").splitlines()}
    missing = [c for c in codes if str(c) not in tags]
    assert not missing, f"vq-admin-agent.8 EXIT STATUS has no entry for {missing}"
    extra = sorted(t for t in tags if t.isdigit() and int(t) not in codes)
    assert not extra, f"vq-admin-agent.8 EXIT STATUS documents statuses the agent never returns: {extra}"


# -- the configuration page ---------------------------------------------------------


def test_config_page_names_every_key():
    _require_groff()
    text = sections(CONFIG_PAGE)
    for section, keys in (("TOP-LEVEL KEYS", {"ssh_config"}), ("HOST KEYS", vq_config.HOST_KEYS),
                          ("PROFILE KEYS", vq_config.PROFILE_KEYS)):
        assert section in text, f"vq-admin.toml.5 has no {section} section"
        missing = sorted(k for k in keys if not has_token(text[section], k))
        assert not missing, f"vq-admin.toml.5 {section} does not mention {missing}"
        tags = roff_tags(CONFIG_PAGE, section)
        missing = sorted(k for k in keys if not has_token(tags, k))
        assert not missing, f"vq-admin.toml.5 {section} has no entry (.TP tag) for {missing}"


def test_config_page_names_every_role_and_transport():
    _require_groff()
    body = render(CONFIG_PAGE)
    for value in (*vq_config.ROLES, *vq_config.TRANSPORTS, *vq_config.SCHEDULERS, *vq_config.PREPARER_READS):
        assert has_token(body, value), f"vq-admin.toml.5 does not name the value {value!r}"


def test_config_page_example_is_a_valid_configuration():
    _require_groff()
    example = textwrap.dedent(sections(CONFIG_PAGE)["EXAMPLES"]).strip()
    parsed = vq_config.parse_config(tomllib.loads(example))
    assert any(h.fleet_role == "managed" and h.runtimes for h in parsed.hosts.values())


# -- the docs that pair with the pages ------------------------------------------------


def test_configuration_reference_names_every_key():
    text = (DOCS_DIR / "configuration.md").read_text(encoding="utf-8")
    missing = sorted(k for k in vq_config.HOST_KEYS | vq_config.PROFILE_KEYS | {"ssh_config"}
                     if f"`{k}`" not in text)
    assert not missing, f"docs/configuration.md does not document {missing}"


def test_docs_index_links_every_doc():
    """docs/index.md is the way in: it links every other page of docs/."""
    index = (DOCS_DIR / "index.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", index))
    missing = sorted(p.name for p in DOCS_DIR.glob("*.md") if p.name != "index.md" and p.name not in linked)
    assert not missing, f"docs/index.md does not link {missing}"
    dangling = sorted(name for name in linked if not (DOCS_DIR / name).exists())
    assert not dangling, f"docs/index.md links pages that do not exist: {dangling}"


def test_provider_guide_gives_every_hook_with_its_exact_signature():
    from vq_admin_hookspecs import HOOK_NAMES, specs

    text = (DOCS_DIR / "providers.md").read_text(encoding="utf-8")
    for name in HOOK_NAMES:
        sig = inspect.signature(getattr(specs, name))  # annotations are strings (PEP 563)
        params = ", ".join(f"{p.name}: {p.annotation}" for p in sig.parameters.values())
        signature = f"{name}({params}) -> {sig.return_annotation}"
        assert signature in text, f"docs/providers.md does not give the exact signature {signature}"
