"""The project's interpreter (.venv/bin/python) as Bazel's Python toolchain.

`venv_python` is a repository rule: at fetch time (offline) it resolves the
absolute path of `<workspace>/.venv/bin/python`, which `make install`
creates, and writes a `py_runtime_pair` toolchain that runs every `py_test`
with it, so tests import the installed, pinned dependencies (TFF 0.87,
TF 2.14, ...) and tff-dp itself (installed editable).
"""

def _venv_python_impl(ctx):
    workspace = ctx.path(Label("//:WORKSPACE")).dirname
    python = workspace.get_child(".venv").get_child("bin").get_child("python")
    if not python.exists:
        fail("%s not found: run `make install` first (see bazel/README.md)." % python)
    ctx.file("BUILD", """
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

py_runtime(
    name = "venv_py3",
    interpreter_path = "{python}",
    python_version = "PY3",
)

py_runtime_pair(name = "venv_pair", py3_runtime = ":venv_py3")

toolchain(
    name = "toolchain",
    toolchain = ":venv_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
    visibility = ["//visibility:public"],
)
""".format(python = python))

venv_python = repository_rule(
    implementation = _venv_python_impl,
    local = True,
)
