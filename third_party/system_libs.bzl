"""Debian's system libraries as Bazel cc_library targets, their flags taken from pkg-config.

Each target below names pkg-config modules, never .so files: pkg-config resolves the transitive
libraries (Debian's Abseil alone is dozens of small .so files), so no library list is copied by
hand and a package update needs no edit here. scripts/setup.sh installs the -dev packages.

Use as @system_libs//:absl, @system_libs//:glog, ...
"""

# Bazel target -> pkg-config modules it stands for.
_LIBRARIES = {
    "absl": [
        "absl_base",
        "absl_flat_hash_map",
        "absl_flat_hash_set",
        "absl_inlined_vector",
        "absl_random_random",
        "absl_span",
        "absl_status",
        "absl_statusor",
        "absl_str_format",
        "absl_strings",
        "absl_synchronization",
        "absl_time",
    ],
    "gflags": ["gflags"],
    "glog": ["libglog"],
    "gtest": ["gtest", "gmock"],
    "gtest_main": ["gtest_main"],
    "hwloc": ["hwloc"],
    "ibverbs": ["libibverbs"],
    "rdmacm": ["librdmacm"],
}

# Libraries whose Debian package ships no pkg-config module: (defines, link flags), by hand.
# libzookeeper-mt-dev (headers under /usr/include/zookeeper/): THREADED declares the synchronous
# calls of the multi-threaded client.
_BY_HAND = {
    "zookeeper": (["THREADED"], ["-lzookeeper_mt"]),
}

def _pkg_config(ctx, args):
    result = ctx.execute(["pkg-config"] + args)
    if result.return_code != 0:
        fail("pkg-config %s failed: %s\nRun ./scripts/setup.sh to install the -dev packages." %
             (" ".join(args), result.stderr.strip()))
    return [f for f in result.stdout.strip().split(" ") if f]

def _system_libs_impl(ctx):
    if ctx.which("pkg-config") == None:
        fail("pkg-config not found. Run ./scripts/setup.sh first.")
    rules = ['package(default_visibility = ["//visibility:public"])', ""]
    for name, modules in sorted(_LIBRARIES.items()):
        # cc_library propagates only `defines` to its dependents, so that is where -D goes. An -I
        # under /usr/include needs nothing: the compiler reaches those headers by their full path
        # (e.g. libibverbs.pc adds -I/usr/include/libnl3, which no herd source includes from).
        defines = []
        for flag in _pkg_config(ctx, ["--cflags"] + modules):
            if flag.startswith("-D"):
                defines.append(flag[2:])
            elif flag.startswith("-I") and flag[2:].startswith("/usr/include"):
                continue
            elif flag != "-pthread":
                fail("pkg-config %s: compile flag %s has no place in a cc_library" %
                     (" ".join(modules), flag))
        linkopts = _pkg_config(ctx, ["--libs"] + modules)
        deps = ['":gtest"'] if name == "gtest_main" else []
        rules.append(
            "cc_library(\n    name = %r,\n    defines = %r,\n    linkopts = %r,\n" %
            (name, defines, linkopts) + "    deps = [%s],\n)\n" % ", ".join(deps),
        )
    for name, (defines, linkopts) in sorted(_BY_HAND.items()):
        rules.append(
            "cc_library(\n    name = %r,\n    defines = %r,\n    linkopts = %r,\n)\n" %
            (name, defines, linkopts),
        )
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("BUILD.bazel", "\n".join(rules))

system_libs = repository_rule(
    implementation = _system_libs_impl,
    environ = ["PKG_CONFIG_PATH"],
    local = True,
)
