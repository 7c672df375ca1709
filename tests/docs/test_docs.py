"""Every example of the manual runs (issue 64): each fenced block of `README.md` and `docs/*.md`
is run against the bundled configuration (`conf/tollgate.yaml`) and the bundled mock, both
started here on free ports, offline — or it is explicitly marked as not run, with why.

* `sh`/`bash`: run by `bash -eo pipefail`; `curl` fails on an HTTP error (`--fail-with-body`)
  unless the block is marked `expect-refusal`. `localhost:8080`, `:8081` and `:9100` are the
  gateway's, the admin listener's and the mock's ports here; `target/release/` the debug
  build's folder; `$TOLLGATE_ADMIN_TOKEN` the admin token.
* `python`: run by the test virtualenv's Python, with the same ports.
* `yaml`: a whole configuration (it has `listen:`) is checked by `tollgate -t`; a fragment is
  merged into the bundled configuration and checked the same way.

A block is marked by an HTML comment on the line before it:
`<!-- docs: not run — why -->` (needs a real service, or starts what this test starts),
`<!-- docs: expect-refusal -->` (an example of a refusal: it must fail).
Blocks without a language (output, diagrams) are not run."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pysupport import free_port, wait_listening  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN_DIR = os.environ.get("TOLLGATE_BIN_DIR", os.path.join(ROOT, "target", "debug"))
PAGES = ["README.md"] + sorted(os.path.join("docs", p) for p in os.listdir(os.path.join(ROOT, "docs")) if p.endswith(".md"))
ADMIN_TOKEN = "docs-admin-token-0123456789abcdef"
AGENT_CLIS = os.environ.get("TOLLGATE_AGENT_CLIS", os.path.expanduser("~/.cache/tollgate/agent-clis/node_modules/.bin"))
RUN = {"sh", "bash", "python", "yaml"}


class Yaml12(yaml.SafeLoader):
    """YAML as tollgate reads it (1.2's core schema): `on`, `off`, `yes`, `no` are strings (a
    fallback chain's `on:` is a key), only true and false are booleans."""


Yaml12.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Yaml12.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def load_yaml(text):
    return yaml.load(text, Loader=Yaml12)


MARK = re.compile(r"<!--\s*docs:\s*(not run|expect-refusal)\s*(?:[—-]+\s*(.*?))?\s*-->")


def blocks(page):
    """(line, language, code, mark, why) of each fenced block of `page`."""
    found, lines = [], open(os.path.join(ROOT, page)).read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and lines[j] != "```":
            j += 1
        mark = MARK.search(lines[start - 1]) if start > 0 else None
        found.append((start + 1, lang, "\n".join(lines[start + 1:j]), mark.group(1) if mark else None, (mark.group(2) or "") if mark else ""))
        i = j + 1
    return found


CASES = [(page, line, lang, code, mark, why) for page in PAGES for (line, lang, code, mark, why) in blocks(page)]


class Env:
    def __init__(self, tmp, gw, admin, mock):
        self.tmp, self.gw, self.admin, self.mock = tmp, gw, admin, mock

    def localise(self, text):
        for port, mine in ((8080, self.gw), (8081, self.admin), (9100, self.mock)):
            text = re.sub(rf"(localhost|127\.0\.0\.1):{port}\b", rf"\g<1>:{mine}", text)
        return text.replace("target/release/", BIN_DIR + "/")

    def demo(self):
        """conf/demo/ with its service account's token endpoint on this test's mock."""
        demo = os.path.join(self.tmp, "demo")
        if not os.path.isdir(demo):
            os.makedirs(demo)
            for name in os.listdir(os.path.join(ROOT, "conf", "demo")):
                with open(os.path.join(ROOT, "conf", "demo", name)) as f, open(os.path.join(demo, name), "w") as out:
                    out.write(self.localise(f.read()))
        return demo

    def bundled(self):
        """The bundled configuration, on this test's ports and data folder."""
        text = open(os.path.join(ROOT, "conf", "tollgate.yaml")).read()
        text = self.localise(text).replace("./data", os.path.join(self.tmp, "data")).replace("conf/demo/", self.demo() + "/")
        return load_yaml(text)


@pytest.fixture(scope="module")
def env():
    tmp = tempfile.mkdtemp(prefix="tollgate-docs-")
    gw, admin, mock_port = free_port(), free_port(), free_port()
    e = Env(tmp, gw, admin, mock_port)
    procs = []
    try:
        mock = subprocess.Popen([os.path.join(BIN_DIR, "tollgate-mock"), "--listen", f"127.0.0.1:{mock_port}"])
        procs.append(mock)
        wait_listening(mock_port, mock, "tollgate-mock")
        path = os.path.join(tmp, "tollgate.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(e.bundled(), f)
        proc = subprocess.Popen([os.path.join(BIN_DIR, "tollgate"), "-c", path], cwd=tmp,
                                env={**os.environ, "RUST_LOG": "warn", "TOLLGATE_ADMIN_TOKEN": ADMIN_TOKEN})
        procs.append(proc)
        wait_listening(gw, proc, "tollgate")
        wait_listening(admin, proc, "tollgate admin")
        yield e
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def merged(base, fragment):
    """`fragment` laid over `base`: maps merged, lists of named entries added or replaced."""
    for k, v in fragment.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            merged(base[k], v)
        elif isinstance(v, list) and isinstance(base.get(k), list) and all(isinstance(x, dict) and "name" in x for x in v):
            names = {x["name"] for x in v}
            base[k] = [x for x in base[k] if not (isinstance(x, dict) and x.get("name") in names)] + v
        else:
            base[k] = v
    return base


def run(env, lang, code):
    work = os.path.join(env.tmp, "work")
    os.makedirs(work, exist_ok=True)
    # Commands run as from the repository's root: its `conf/` is there.
    if not os.path.exists(os.path.join(work, "conf")):
        os.symlink(os.path.join(ROOT, "conf"), os.path.join(work, "conf"))
    home = os.path.join(env.tmp, "home")
    os.makedirs(home, exist_ok=True)
    # The agent CLIs the set-up installs (tests/run_all.sh), a home of their own.
    path = f"{BIN_DIR}:{AGENT_CLIS}:{os.environ.get('PATH', '')}"
    shell_env = {**os.environ, "TOLLGATE_ADMIN_TOKEN": ADMIN_TOKEN, "PATH": path, "HOME": home, "TERM": "dumb", "NO_COLOR": "1"}
    # A variable a configuration names for a secret (`*_env: NAME`) is set to a stand-in.
    for name in re.findall(r"_env:\s*\"?([A-Z][A-Z0-9_]*)", code):
        shell_env.setdefault(name, "docs-stand-in-secret")
    if lang in ("sh", "bash"):
        script = "curl() { command curl --fail-with-body \"$@\"; }\n" + env.localise(code)
        return subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=work, env=shell_env, capture_output=True, text=True, timeout=120)
    if lang == "python":
        return subprocess.run([sys.executable, "-c", env.localise(code)], cwd=work, env=shell_env, capture_output=True, text=True, timeout=120)
    doc = load_yaml(env.localise(code))
    # A list of named entries is a provider list's.
    if isinstance(doc, list):
        doc = {"providers": doc}
    config = doc if isinstance(doc, dict) and "listen" in doc else merged(env.bundled(), doc or {})
    config["listen"], config.setdefault("admin", {})["listen"] = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    path = os.path.join(work, "check.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    # From the repository's root: a file an example names (tests/fixtures/…) is found.
    shell_env.setdefault("AWS_ACCESS_KEY_ID", "docs-stand-in")
    shell_env.setdefault("AWS_SECRET_ACCESS_KEY", "docs-stand-in")
    return subprocess.run([os.path.join(BIN_DIR, "tollgate"), "-t", "-c", path], cwd=ROOT, env=shell_env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("page,line,lang,code,mark,why", CASES, ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_the_example_runs(env, page, line, lang, code, mark, why):
    if lang not in RUN:
        pytest.skip(f"a {lang or 'plain'} block is shown, not run")
    if mark == "not run":
        assert why, f"{page}:{line}: a block not run says why"
        pytest.skip(why)
    done = run(env, lang, code)
    said = f"{page}:{line} ({lang}) exited {done.returncode}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    if mark == "expect-refusal":
        assert done.returncode != 0, said
    else:
        assert done.returncode == 0, said


def test_every_page_is_in_the_summary():
    summary = open(os.path.join(ROOT, "docs", "SUMMARY.md")).read()
    pages = [p for p in os.listdir(os.path.join(ROOT, "docs")) if p.endswith(".md") and p != "SUMMARY.md"]
    assert [p for p in pages if f"({p})" not in summary] == []


def test_the_readme_is_short():
    assert len(open(os.path.join(ROOT, "README.md")).read().split("\n")) <= 200


BOGUS = "no_such_key_docs"


def accepted(doc):
    """The keys the parser accepts where `doc` puts the bogus key, or None when it is no section
    of named keys (the parser's own refusal of an unknown key lists them)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump({"listen": "127.0.0.1:1", **doc}, f)
    try:
        out = subprocess.run([os.path.join(BIN_DIR, "tollgate"), "-t", "-c", f.name], capture_output=True, text=True, timeout=30)
    finally:
        os.unlink(f.name)
    m = re.search(rf"unknown field `{BOGUS}`, expected (?:one of )?(.*?) at line", out.stderr)
    return re.findall(r"`(\w+)`", m.group(1)) if m else None


def sections(path, place, depth=0):
    """Every section of the configuration below `place` (a function putting a value where the
    section is), with the keys it accepts: {dotted path: keys}."""
    keys = accepted(place({BOGUS: 1}))
    if keys is None:
        return {}
    found = {path or "(top level)": keys}
    if depth < 4:
        for k in keys:
            for shape, suffix in ((lambda v: v, ""), (lambda v: [v], "[]"), (lambda v: {"x": v}, ".*")):
                inner = sections(f"{path}.{k}{suffix}".lstrip("."), lambda v, k=k, shape=shape: place({k: shape(v)}), depth + 1)
                if inner:
                    found.update(inner)
                    break
    return found


def test_the_reference_lists_exactly_the_keys_the_parser_accepts():
    """docs/configuration.md's "Every key" lists each section's keys; the parser, asked where an
    unknown key would go, names the keys it accepts there: the two agree both ways."""
    reference = open(os.path.join(ROOT, "docs", "configuration.md")).read()
    listed = {m.group(1): re.findall(r"`(\w+)`", m.group(2).split(" (see")[0])
              for m in re.finditer(r"^- `([^`]+)`: (.*)$", reference.split("## Every key")[-1], re.M)}
    found = sections("", lambda v: v)
    assert len(found) > 10, found
    assert {p: sorted(k) for p, k in found.items()} == {p: sorted(k) for p, k in listed.items()}


def anchors(path):
    """The anchors of a page's headings, as Markdown renderers make them."""
    heads = re.findall(r"^#{1,6} (.*)$", open(path).read(), re.M)
    return {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in heads}


def test_every_link_between_pages_reaches_its_page_and_heading():
    broken = []
    for page in PAGES:
        here = os.path.dirname(os.path.join(ROOT, page))
        for target, anchor in re.findall(r"\]\(([\w./-]*\.md)?(?:#([\w-]+))?\)", open(os.path.join(ROOT, page)).read()):
            path = os.path.normpath(os.path.join(here, target)) if target else os.path.join(ROOT, page)
            if not os.path.exists(path):
                broken.append(f"{page}: {target}")
            elif anchor and anchor not in anchors(path):
                broken.append(f"{page}: {target}#{anchor}")
    assert broken == []
