"""Ways in: what a new user copies from the README installs the right torch; Binder installs
what the kit imports; running a lesson leaves the checkout as it was, and a notebook saved with outputs
still counts as built from its source; CI installs into a new virtual environment of its own."""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys


ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"
WALL_CLOCK_S = 600


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", r.strip(), maxsplit=1)[0].lower() for r in requirements
            if r.strip() and not r.strip().startswith(("#", "-"))}


def test_readme_commands_install_the_cpu_wheel_and_say_which_is_which():
    """Each copy-paste block installing torch is for CPU Linux and takes the CPU wheel (PyPI's Linux torch
    pulls GBs of CUDA wheels); the CUDA command is given for GPU machines, labelled."""
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    torch_lines = [line for b in blocks for line in b.splitlines() if re.search(r"pip install torch\b", line)]
    assert torch_lines and all(CPU_INDEX in line for line in torch_lines), torch_lines
    assert re.search(r"NVIDIA GPUs.*PyPI.*\(GPU: `pip install torch==2\.13\.0`\)", README), "no labelled GPU command"


def test_binder_installs_every_dependency_of_the_kit():
    """postBuild installs the kit with --no-deps: binder/requirements.txt must list what the kit imports.
    IPython comes with repo2docker's Jupyter environment."""
    text = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
    assert deps is not None
    entries = re.sub(r"#[^\n]*", "", deps.group(1))  # a comment's quoted words are not dependencies
    needed = _names(re.findall(r'"([^"]+)"', entries)) - {"ipython"}
    assert "--no-deps" in (ROOT / "binder" / "postBuild").read_text()
    listed = _names((ROOT / "binder" / "requirements.txt").read_text().splitlines())
    assert needed <= listed, f"missing from binder/requirements.txt: {sorted(needed - listed)}"


def _copy_lessons(tmp_path: pathlib.Path) -> pathlib.Path:
    dest = tmp_path / "lessons"
    shutil.copytree(ROOT / "lessons", dest, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    return dest


def test_a_notebook_saved_with_outputs_still_counts_as_built_from_its_source(tmp_path):
    """The check compares what the sources say (cells, their kinds, sources and tags), not outputs."""
    lessons = _copy_lessons(tmp_path)
    nb_path = sorted(lessons.glob("[0-9][0-9]_*.ipynb"))[0]
    nb = json.loads(nb_path.read_text())
    code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["ran\n"]}]
    code["execution_count"] = 3
    nb["metadata"]["language_info"]["version"] = "3.12.1"
    nb_path.write_text(json.dumps(nb, indent=1))
    check = [sys.executable, str(lessons / "build.py"), "--check"]
    proc = subprocess.run(check, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    code["source"] = "changed = True"  # a real difference is still caught
    nb_path.write_text(json.dumps(nb, indent=1))
    proc = subprocess.run(check, capture_output=True, text=True)
    assert proc.returncode == 1 and nb_path.name in proc.stdout


def test_ci_installs_into_a_new_virtual_environment_of_its_own():
    script = (ROOT / ".ci" / "run").read_text()
    venv_at = script.index("-m venv")
    installs = [m.start() for m in re.finditer(r"-m pip install", script)]
    assert installs and all(i > venv_at for i in installs)
    assert all(line.lstrip().startswith('"$PY" -m pip install') for line in script.splitlines()
               if "-m pip install" in line and not line.lstrip().startswith("#"))
    first = script[installs[0]:script.index("\n", installs[0])]
    assert '"torch==2.13.0"' in first  # pinned, and first
    assert re.search(r'"\$PY" -m pip install -q "accelerate[^"]*" -c <\(echo "torch==2.13.0"\)', script)
    # the README's test command, word for word (CI runs what a contributor is told to run)
    readme_cmd = re.search(r"&& (python -m pytest[^\n`]*)", (ROOT / "README.md").read_text()).group(1).strip()
    assert '"$PY" -m ' + readme_cmd.removeprefix("python -m ") in script, readme_cmd


def test_the_readme_command_keeps_a_modules_tests_on_one_worker():
    """Under `-n 2 --dist loadgroup` each module's tests run on one worker (one module-scoped cluster, and
    the lessons one after another): the workers collect with `-n` unset, so a grouping gated on it never
    happened (each test then went to either worker)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                          "-v", "tests/test_renamed.py", "tests/test_choices.py"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")})
    assert out.returncode == 0, out.stdout[-3000:]
    workers: dict[str, set[str]] = {}
    for m in re.finditer(r"\[(gw\d)\] .*?PASSED (tests/[\w.]+)::", out.stdout):
        workers.setdefault(m.group(2), set()).add(m.group(1))
    assert set(workers) == {"tests/test_renamed.py", "tests/test_choices.py"}, out.stdout[-3000:]
    assert all(len(w) == 1 for w in workers.values()), workers
