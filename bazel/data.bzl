"""`@shared_data`: the real datasets as a declared input of the tests.

A repository rule that links each file of the data directory
(`TFF_DP_DATA_DIR`, else `../shared/data` beside the workspace, as
tasks/data_dir.py resolves it) into an external repository with one
filegroup, `@shared_data//:data`. Every py_test has it as data, and
bazel/pytest_main.py points the tests at its runfiles copy, so a changed
dataset reruns the tests. A missing directory gives an empty filegroup:
the data tests then skip, or fail under CI=true (tests/conftest.py).
"""

def _shared_data_impl(ctx):
    path = ctx.os.environ.get("TFF_DP_DATA_DIR")
    if path:
        data = ctx.path(path)
    else:
        data = ctx.path(Label("//:WORKSPACE")).dirname.dirname.get_child("shared").get_child("data")
    names = []
    if data.exists:
        for f in data.readdir():
            if not f.basename.startswith(".") and f.basename not in ("BUILD", "WORKSPACE", "BUILD.bazel"):
                ctx.symlink(f, f.basename)
                names.append(f.basename)
    ctx.file("WORKSPACE", "workspace(name = \"shared_data\")\n")
    ctx.file("BUILD", """# %s (bazel/data.bzl)
filegroup(
    name = "data",
    srcs = %s,
    visibility = ["//visibility:public"],
)
""" % (data, repr(sorted(names))))

shared_data = repository_rule(
    implementation = _shared_data_impl,
    environ = ["TFF_DP_DATA_DIR"],
    local = True,
)
