"""tff-dp's Bazel macros: a py_library at its installed path, a pytest py_test.

The BUILD files that use them are written by bazel/gen_build.py.
"""

def _installed_layout_impl(ctx):
    # setup.py installs aggregators/x.py as tff_dp/aggregators/x.py: the same
    # files appear at that path in the runfiles tree, so
    # `import tff_dp.aggregators.x` works from runfiles as from an install.
    # Paths from the runfiles root, under this repository's directory (so it
    # also holds where a user's workspace loads tff-dp as @tff_dp).
    repository = ctx.label.workspace_name or ctx.workspace_name
    prefix = "%s/%s/" % (repository, ctx.attr.installed_as)
    symlinks = {prefix + f.basename: f for f in ctx.files.srcs}
    return [DefaultInfo(runfiles = ctx.runfiles(root_symlinks = symlinks))]

_installed_layout = rule(
    implementation = _installed_layout_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".py"]),
        "installed_as": attr.string(mandatory = True),
    },
)

def tff_dp_library(name, srcs, deps = [], installed_as = None, visibility = None):
    """A py_library of tff-dp modules, importable by their installed names.

    Args:
      name: Target name (the module's name, or `__init__`).
      srcs: The module files (of this package).
      deps: The tff-dp targets they import (third-party packages come from
        the venv runtime, bazel/python.bzl).
      installed_as: Where setup.py installs this directory (e.g.
        "tff_dp/aggregators" for aggregators/), when that is not the
        directory itself.
      visibility: Defaults to public: users depend on these targets.
    """
    data = []
    if installed_as:
        _installed_layout(
            name = name + "_installed",
            srcs = srcs,
            installed_as = installed_as,
        )
        data = [":" + name + "_installed"]
    native.py_library(
        name = name,
        srcs = srcs,
        data = data,
        deps = deps + ["//:import_root"],
        srcs_version = "PY3",
        visibility = visibility or ["//visibility:public"],
    )

def tff_dp_test(name, src, timeout = "eternal", deps = [], data = [], **kwargs):
    """A py_test that runs pytest on `src` from the runfiles tree.

    Args:
      name: Target name.
      src: The test file (pytest style).
      timeout: Bazel timeout class ("eternal": 3600 s; two test files share
        the 2 cores, and the slowest file took 567 s alone on a slow day).
      deps: The tff-dp targets the test imports, or runs in a subprocess.
      data: Repository files the test reads.
      **kwargs: Passed to py_test.
    """
    native.py_test(
        name = name,
        srcs = ["//bazel:pytest_main.py", src],
        main = "//bazel:pytest_main.py",
        args = ["$(location %s)" % src],
        data = data + [
            "//:pyproject.toml",
            "//bazel:strict_imports",
            "@shared_data//:data",
        ],
        deps = deps + ["//tests:conftest", "//:import_root"],
        python_version = "PY3",
        srcs_version = "PY3",
        legacy_create_init = False,
        timeout = timeout,
        **kwargs
    )
