"""Offline stand-in for rules_java: Bazel's native Java rules, re-exported.

@bazel_tools registers its JDK toolchains from files that load these names
from @rules_java; tff-dp builds no Java (see bazel/README.md).
"""

java_binary = native.java_binary
java_import = native.java_import
java_library = native.java_library
java_proto_library = native.java_proto_library
java_runtime = native.java_runtime
java_toolchain = native.java_toolchain
