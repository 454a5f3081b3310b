"""The project's venv (.venv, `make install`) as Bazel's Python toolchain.

`venv_python` is a repository rule. At fetch time (offline) it writes
* `python`: a launcher that runs `<workspace>/.venv/bin/python` (the venv is
  found from that path, so the launcher keeps it), and
* `installed.txt`: the Python version and `pip freeze` of the venv (tff-dp
  itself left out: it comes from targets),
and registers them as an in-build `py_runtime`. `installed.txt` is an input
of every py_test, so a changed third-party package reruns the tests
instead of serving cached results. The rule is `local`: it runs again at
every Bazel server start (bazel/test.sh shuts the server down after each
run), and its output only changes when the venv did.
"""

def _venv_python_impl(ctx):
    workspace = ctx.path(Label("//:WORKSPACE")).dirname
    python = workspace.get_child(".venv").get_child("bin").get_child("python")
    if not python.exists:
        fail("%s not found: run `make install` first (see bazel/README.md)." % python)
    freeze = ctx.execute(
        [python, "-m", "pip", "freeze", "--all", "--exclude", "tff-dp"],
        environment = {"PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    version = ctx.execute([python, "-c", "import sys; print(sys.version)"])
    if freeze.return_code or version.return_code:
        fail("%s: pip freeze failed: %s%s" % (python, freeze.stderr, version.stderr))
    ctx.file("installed.txt", "python " + version.stdout + freeze.stdout)
    ctx.file("python", "#!/bin/sh\nexec '%s' \"$@\"\n" % python, executable = True)
    ctx.file("BUILD", """
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

py_runtime(
    name = "venv_py3",
    interpreter = "python",
    files = ["installed.txt"],
    python_version = "PY3",
)

py_runtime_pair(name = "venv_pair", py3_runtime = ":venv_py3")

toolchain(
    name = "toolchain",
    toolchain = ":venv_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
    visibility = ["//visibility:public"],
)
""")

venv_python = repository_rule(
    implementation = _venv_python_impl,
    local = True,
)
