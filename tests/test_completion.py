"""Shell completion generated from the argument tree with shtab: the committed files
pip installs agree with the parser, ``vq admin completion bash|zsh`` prints them, and
a real bash completes ``vq admin up<TAB>`` to ``update`` from the installed file."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from installed_venv import ROOT, clean_env, installed_prefix
from support import write_config
from vq_admin import completion
from vq_admin.cli import build_parser

COMPLETIONS = ROOT / "completions"
REGENERATE = "python -m vq_admin.completion --write completions"

CONFIG = """
[hosts.cluster]
fleet_role = "managed"
[hosts."login.example"]
fleet_role = "alias"
canonical_host = "cluster"
[hosts.cluster.scheduler_runtime_deployments.vibeqc-release]
update_command = "/site/deploy"
verify_command = "/site/verify"
source_repo = "/srv/src"
[hosts.cluster.scheduler_runtime_deployments."dotted.prog"]
update_command = "/site/deploy"
verify_command = "/site/verify"
source_repo = "/srv/src"
"""

# COMP_* as bash sets them for a Tab at the end of the words given; prints COMPREPLY, one per line.
COMPLETE_FN = r"""
complete_words() {
  COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}; COMPREPLY=()
  local spec fn
  spec=$(complete -p "$1") || { echo "NO COMPLETION FOR $1"; return 1; }
  fn=${spec#*-F }; fn=${fn%% *}
  "$fn" "$1" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
  printf '%s\n' "${COMPREPLY[@]}"
}
"""


def _require(program: str, package: str) -> None:
    if shutil.which(program):
        return
    reason = f"{program} (Debian package {package}) is not installed; scripts/test.sh installs it"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set and {reason}", pytrace=False)
    pytest.skip(reason)


def bash(script: str, env: dict[str, str]) -> str:
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], capture_output=True, text=True,
                          env=env, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return done.stdout


def tabs(load: str, lines: list[str], env: dict[str, str]) -> list[list[str]]:
    """For each command line (words, the last one being completed), the candidates bash offers."""
    script = load + "\n" + COMPLETE_FN + "\n" + "\n".join(
        f"complete_words {line}; echo '<<END>>'" for line in lines)
    out = bash(script, env)
    return [chunk.split() for chunk in out.split("<<END>>\n")[:-1]]


LINES = ["vq admin up", "vq ad", "vq-admin up", "vq admin status ''", "vq admin update ''", "vq admin update --exp",
         "vq admin launcher ''", "vq admin launcher vibeqc-release ''", "vq admin completion ''",
         "vq admin provider ''", "vq-admin status --te", "vq admin update vibeqc-release ''",
         "vq-admin rollback dotted.prog ''", "vq admin update cluster ''", "vq admin update vibeqc-release cluster ''"]
EXPECTED = [["update"], ["admin"], ["update"], ["cluster", "login.example"],
            ["dotted.prog", "vibeqc-release", "cluster", "login.example"], ["--expected-sha"],
            ["dotted.prog", "vibeqc-release"], ["cluster", "login.example"], ["bash", "zsh"], ["install", "test"],
            ["--textfile"],
            # after PROGRAM only hosts (issue 31: programs were offered again); after HOST (the helper lane's
            # one word, or PROGRAM HOST) no more words
            ["cluster", "login.example"], ["cluster", "login.example"], [], []]


@pytest.fixture
def config_env(tmp_path) -> dict[str, str]:
    config = write_config(tmp_path / "admin.toml", CONFIG)
    return dict(os.environ, VQ_ADMIN_CONFIG=str(config))


# -- the committed files against the parser ------------------------------------------------


def _tree(parser, path=()):
    yield path, parser
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for name, child in action.choices.items():
                yield from _tree(child, (*path, name))


def _bash_array(text: str, name: str) -> list[str]:
    found = re.search(rf"^{re.escape(name)}=\((.*?)\)$", text, re.M | re.S)
    assert found, f"no array {name}"
    return [a or b for a, b in re.findall(r"'([^']*)'|(\S+)", found.group(1))]


@pytest.mark.parametrize("command", sorted(completion.COMMANDS))
def test_committed_bash_file_has_every_verb_and_option(command):
    text = (COMPLETIONS / completion.FILES[("bash", command)]).read_text(encoding="utf-8")
    root = "_shtab_" + re.sub(r"\W", "_", completion.COMMANDS[command])
    base = root + ("_admin" if command == "vq" else "")
    for path, parser in _tree(build_parser()):
        prefix = "_".join([base, *(re.sub(r"\W", "_", p) for p in path)])
        # Options whose help is suppressed (the top level's --config/--state-dir) are hidden on purpose.
        options = [o for a in parser._actions if a.help != argparse.SUPPRESS for o in a.option_strings]
        have = _bash_array(text, f"{prefix}_option_strings")
        missing = sorted(set(options) - set(have))
        assert not missing, (f"completions/{completion.FILES[('bash', command)]} lacks {missing} of "
                             f"'{' '.join(path) or '(top)'}': run {REGENERATE}")
        verbs = [name for a in parser._actions if a.__class__.__name__ == "_SubParsersAction" for name in a.choices]
        if verbs:
            assert sorted(_bash_array(text, f"{prefix}_pos_0_choices")) == sorted(verbs), f"run {REGENERATE}"


@pytest.mark.parametrize("key", sorted(completion.FILES), ids="-".join)
def test_committed_file_is_what_the_generator_writes(key):
    import shtab

    path = COMPLETIONS / completion.FILES[key]
    text = path.read_text(encoding="utf-8")
    made_by = re.search(r"\(shtab ([^)]+)\)", text)
    if not made_by or made_by.group(1) != shtab.__version__:
        pytest.skip(f"{path.name} was generated with shtab {made_by and made_by.group(1)}, this is "
                    f"{shtab.__version__}; the verb and option check above still applies")
    assert text == completion.script(*key), f"completions/{completion.FILES[key]} is stale: run {REGENERATE}"


def test_completion_files_are_installed_by_setup_cfg():
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    data = cfg["options.data_files"]
    assert data["share/bash-completion/completions"].split() == ["completions/bash/*"]
    assert data["share/zsh/site-functions"].split() == ["completions/zsh/*"]
    assert sorted(str(p.relative_to(COMPLETIONS)) for p in COMPLETIONS.rglob("*") if p.is_file()) == sorted(
        completion.FILES.values())


# -- behaviour in a real bash --------------------------------------------------------------


def test_the_completion_verb_prints_what_bash_loads(tmp_path, config_env):
    _require("bash", "bash")
    done = subprocess.run([sys.executable, "-m", "vq_admin.cli", "completion", "bash"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout == completion.all_scripts("bash")
    script = tmp_path / "printed.bash"
    script.write_text(done.stdout)
    assert tabs(f"source {script}", LINES, config_env) == EXPECTED


def test_the_zsh_script_is_valid_zsh(tmp_path):
    _require("zsh", "zsh")
    done = subprocess.run([sys.executable, "-m", "vq_admin.cli", "completion", "zsh"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0
    script = tmp_path / "printed.zsh"
    script.write_text(done.stdout)
    check = subprocess.run(["zsh", "-n", str(script)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    assert "compdef _shtab_vq_admin -N vq-admin" in done.stdout and "compdef _shtab_vqcli -N vq" in done.stdout
    assert "_vq_admin_hosts" in done.stdout and "update" in done.stdout


def test_names_come_from_the_configuration_only_when_it_exists(tmp_path):
    _require("bash", "bash")
    env = dict(os.environ, VQ_ADMIN_CONFIG=str(tmp_path / "missing.toml"))
    assert tabs(f"source {COMPLETIONS / 'bash' / 'vq'}", ["vq admin status ''", "vq admin up"], env) == [
        [], ["update"]]


def test_shtab_is_imported_only_for_completion(tmp_path):
    code = ("import sys\nfrom vq_admin.entry import main\n"
            "main(['status', '--state-dir', sys.argv[1]]); main(['check'])\n"
            "print('LOADED' if 'shtab' in sys.modules else 'CLEAN', file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, VQ_ADMIN_CONFIG=str(tmp_path / "none.toml")))
    assert done.stderr.splitlines()[-1] == "CLEAN", done.stderr


# -- the installed files -------------------------------------------------------------------


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> Path:
    return installed_prefix(tmp_path_factory.getbasetemp())


def test_installed_files(prefix):
    for (shell, _command), name in completion.FILES.items():
        where = ("bash-completion/completions" if shell == "bash" else "zsh/site-functions")
        installed = prefix / "share" / where / Path(name).name
        assert installed.is_file(), f"{installed} was not installed"
        assert installed.read_bytes() == (COMPLETIONS / name).read_bytes()
    assert (prefix / "share" / "zsh" / "site-functions" / "_vq").read_text().startswith("#compdef vq\n")


def test_bash_completes_vq_admin_up_from_the_installed_file(prefix, config_env):
    _require("bash", "bash")
    env = dict(clean_env(prefix), VQ_ADMIN_CONFIG=config_env["VQ_ADMIN_CONFIG"])
    installed = prefix / "share" / "bash-completion" / "completions"
    load = f"source {installed / 'vq'}; source {installed / 'vq-admin'}; complete -p vq vq-admin >&2"
    assert tabs(load, LINES, env) == EXPECTED


def test_bash_completion_loads_the_installed_file_by_command_name(prefix, config_env):
    """bash-completion's own loader finds the file through XDG_DATA_DIRS, as on an operator's shell."""
    _require("bash", "bash")
    loader = Path("/usr/share/bash-completion/bash_completion")
    if not loader.exists():
        reason = "bash-completion is not installed; scripts/test.sh installs it"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and {reason}", pytrace=False)
        pytest.skip(reason)
    env = dict(clean_env(prefix), VQ_ADMIN_CONFIG=config_env["VQ_ADMIN_CONFIG"],
               XDG_DATA_DIRS=f"{prefix / 'share'}:/usr/local/share:/usr/share")
    env.pop("BASH_COMPLETION_USER_DIR", None)
    load = textwrap.dedent(f"""\
        source {loader}
        complete -p vq 2>/dev/null && echo "vq completion defined too early" && exit 1
        _completion_loader vq; _completion_loader vq-admin
        """)
    assert tabs(load, ["vq admin up", "vq-admin update ''"], env) == [
        ["update"], ["dotted.prog", "vibeqc-release", "cluster", "login.example"]]


# A real interactive zsh on a pseudo-terminal (zsh's own zpty module): compinit autoloads the
# installed _vq from fpath by its #compdef line, and the Tab is typed.  Each wait is bounded.
ZSH_DRIVER = r"""
zmodload zsh/zpty
zpty z 'TERM=dumb zsh -f -i'
zpty -w z "PS1='PROMPT> '; fpath=($1 \$fpath); autoload -Uz compinit; compinit -u -D; PATH=$2:\$PATH; print READY"
out=""
for i in {1..400}; do
  zpty -rt z chunk 2>/dev/null && out+=$chunk
  [[ $out == *READY* ]] && break
  sleep 0.05
done
[[ $out == *READY* ]] || { print "zsh did not start"; exit 2 }
zpty -w -n z "$3"$'\t'
out=""
shift 3
for i in {1..400}; do
  zpty -rt z chunk 2>/dev/null && out+=$chunk
  missing=0
  for want in "$@"; do [[ $out == *$want* ]] || missing=1; done
  (( missing )) || break
  sleep 0.05
done
zpty -d z
print -r -- "$out"
exit $missing
"""


@pytest.mark.parametrize("typed, shown", [("vq admin up", ["vq admin update "]),
                                          ("vq-admin up", ["vq-admin update "]),
                                          ("vq admin status ", ["cluster", "login.example"])],
                         ids=["vq", "vq-admin", "hosts"])
def test_zsh_completes_from_the_installed_file(prefix, config_env, tmp_path, typed, shown):
    _require("zsh", "zsh")
    driver = tmp_path / "drive.zsh"
    driver.write_text(ZSH_DRIVER)
    env = dict(clean_env(prefix), VQ_ADMIN_CONFIG=config_env["VQ_ADMIN_CONFIG"], HOME=str(tmp_path))
    done = subprocess.run(["zsh", "-f", str(driver), str(prefix / "share" / "zsh" / "site-functions"),
                           str(prefix / "bin"), typed, *shown], capture_output=True, text=True, timeout=90, env=env,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"zsh did not offer {shown} for {typed!r}:\n{done.stdout!r}\n{done.stderr}"


@pytest.mark.parametrize("typed, offered", [(["update", ""], ["dotted.prog", "vibeqc-release", "cluster",
                                                               "login.example"]),
                                            (["update", "vibeqc-release", ""], ["cluster", "login.example"]),
                                            (["update", "cluster", ""], []),
                                            (["rollback", "dotted.prog", "cluster", ""], [])])
def test_zsh_offers_hosts_after_a_program_and_nothing_after_a_host(config_env, typed, offered):
    """zsh's [PROGRAM] HOST completer reads the word before the cursor, as bash's does (compadd stubbed)."""
    _require("zsh", "zsh")
    load = re.search(r"# Custom Preamble\n(.*?)\n# End Custom Preamble", (COMPLETIONS / "zsh/_vq").read_text(),
                     re.S)
    assert load, "no preamble in _vq"
    words = " ".join(f"'{w}'" for w in ["vq", "admin", *typed])
    script = (load.group(1) + "\ncompadd() { shift; local n; for n in \"$@\"; do print -rl -- ${(P)n}; done }\n"
              f"words=({words}); CURRENT=${{#words}}; _vq_admin_targets; true")
    done = subprocess.run(["zsh", "-f", "-c", script], capture_output=True, text=True, timeout=60, env=config_env,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == offered, done.stdout
