"""`tqgguf doctor`: the real machine (consistency, not presence) and fake machines via the injectable seams."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tqgguf.doctor import (
    MIN_CMAKE_VULKAN,
    VERSION_TIMEOUT_S,
    VK_LAYER_SETTINGS_MIN_HEADER,
    DoctorReport,
    format_report,
    parse_version,
    parse_vulkan_header,
    run_doctor,
)

VERSION_RE = re.compile(r"^\d+\.\d+")

# ---- the real machine ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real() -> DoctorReport:
    return run_doctor()


def _real_version(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout


def test_real_compilers_and_cmake(real):
    for name, exe in (("c-compiler", "gcc"), ("c++-compiler", "g++")):
        t = real.tool(name)
        assert t.found and t.path and t.status == "ok", t
        assert t.version and VERSION_RE.match(t.version), t
        assert t.detail in ("gcc", "clang", "apple-clang"), t
        # the parsed version is the one the compiler itself reports
        assert t.version in _real_version([t.path, "--version"])
        if t.detail == "gcc" and shutil.which(exe):
            assert _real_version([exe, "-dumpfullversion"]).strip() == t.version
    cm = real.tool("cmake")
    assert cm.found and cm.status == "ok" and cm.path == shutil.which("cmake")
    m = re.search(r"version (\d+\.\d+\.\d+)", _real_version(["cmake", "--version"]))
    assert cm.version == m.group(1)
    assert parse_version(cm.version) >= (3, 14)


def test_real_backends(real):
    cpu = real.backend("cpu")
    assert cpu.buildable, cpu
    assert cpu.reasons == []
    assert [b.backend for b in real.backends] == ["cpu", "cuda", "hip", "vulkan", "metal"]
    if sys.platform != "darwin":
        assert real.tool("xcode-sdk").status == "not applicable"
        assert real.tool("metal").status == "not applicable"
        metal = real.backend("metal")
        assert not metal.buildable and "macOS" in metal.reasons[0]


def test_real_optional_tools_consistent_with_which(real):
    ninja = real.tool("ninja")
    assert ninja.found == bool(shutil.which("ninja"))
    assert ninja.optional
    nvcc = real.tool("nvcc")
    if shutil.which("nvcc"):
        assert nvcc.found and nvcc.path == shutil.which("nvcc")
        assert nvcc.version and VERSION_RE.match(nvcc.version)
        assert nvcc.version.split(".")[0] in _real_version(["nvcc", "--version"])
    if not nvcc.found:
        assert nvcc.status == "missing" and not real.backend("cuda").buildable
    else:
        # CUDA is buildable whenever the base toolchain and a new-enough nvcc are there, GPU or not
        assert real.backend("cuda").buildable == (nvcc.status in ("ok", "unknown") and real.backend("cpu").buildable)
    smi = real.tool("nvidia-smi")
    assert smi.found == bool(shutil.which("nvidia-smi"))
    if not smi.found:
        assert real.gpus == []


def test_real_report_serialises_and_formats(real):
    d = real.to_dict()
    again = json.loads(json.dumps(d))
    assert again == d
    assert {t["name"] for t in d["tools"]} >= {"c-compiler", "c++-compiler", "cmake", "ninja", "git", "nvcc",
                                              "vulkan-headers", "glslc", "spirv-headers", "hip", "xcode-sdk"}
    assert set(d["backends"][0]) >= {"backend", "buildable", "reasons", "fixes"}
    text = format_report(real)
    for word in ("cmake", "cpu", "cuda", "vulkan", "hip", "metal"):
        assert word in text


# ---- fake machines ------------------------------------------------------------------------------

GCC12 = "gcc (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc.\n"
GXX12 = "g++ (Debian 12.2.0-14+deb12u1) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc.\n"
CMAKE = "cmake version {}\n\nCMake suite maintained and supported by Kitware (kitware.com/cmake).\n"

BASE = {
    "cc": GCC12,
    "c++": GXX12,
    "cmake": CMAKE.format("3.25.1"),
    "ninja": "1.11.1\n",
    "git": "git version 2.39.5\n",
}


class Fake:
    """A fake machine: `tools` maps a command name to its `--version`-ish output, an exception to raise,
    a (returncode, output) pair, or a callable(argv) returning one of those."""

    def __init__(self, tools: dict):
        self.tools = dict(tools)
        self.calls: list[tuple[list[str], dict]] = []

    def which(self, name: str) -> str | None:
        return f"/fake/bin/{name}" if name in self.tools else None

    def run(self, argv, **kw):
        self.calls.append((list(argv), kw))
        spec = self.tools.get(Path(argv[0]).name)
        if callable(spec):
            spec = spec(list(argv))
        if isinstance(spec, BaseException):
            raise spec
        rc, out = spec if isinstance(spec, tuple) else (0, spec)
        if spec is None:
            raise FileNotFoundError(2, "No such file or directory", argv[0])
        return subprocess.CompletedProcess(argv, rc, out, "")

    def doctor(self, tmp_path: Path, **kw) -> DoctorReport:
        kw.setdefault("env", {})
        kw.setdefault("fs_root", tmp_path / "root")
        kw.setdefault("platform", "linux")
        return run_doctor(which=self.which, run=self.run, **kw)


def _touch(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def vulkan_core(minor: int, patch: int, layer_settings: bool) -> str:
    # the shape of the real vulkan_core.h lines (Debian 12's libvulkan-dev 1.3.239 checked)
    text = (
        "#ifndef VULKAN_CORE_H_\n#define VULKAN_CORE_H_ 1\n"
        "// Version of this file\n"
        f"#define VK_HEADER_VERSION {patch}\n\n"
        "// Complete version of this file\n"
        f"#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, {minor}, VK_HEADER_VERSION)\n"
    )
    if layer_settings:
        text += ('// VK_EXT_layer_settings is a preprocessor guard. Do not pass it to API calls.\n'
                 '#define VK_EXT_layer_settings 1\n#define VK_EXT_LAYER_SETTINGS_SPEC_VERSION 2\n'
                 '#define VK_EXT_LAYER_SETTINGS_EXTENSION_NAME "VK_EXT_layer_settings"\n')
    return text + "#endif\n"


def vulkan_root(tmp_path: Path, minor: int, patch: int, layer_settings: bool) -> Path:
    """A fake file system with Vulkan + SPIR-V headers laid out like Debian's packages."""
    root = tmp_path / "root"
    _touch(root / "usr/include/vulkan/vulkan_core.h", vulkan_core(minor, patch, layer_settings))
    _touch(root / "usr/include/vulkan/vulkan.hpp", "// C++ bindings\n")
    _touch(root / "usr/include/spirv/unified1/spirv.hpp", "namespace spv {}\n")
    _touch(root / "usr/share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake", "")
    _touch(root / "usr/share/cmake/SPIRV-Headers/SPIRV-HeadersConfigVersion.cmake", 'set(PACKAGE_VERSION "1.5.5")\n')
    return root


LDCONFIG_VULKAN = (
    "1234 libs found in cache `/etc/ld.so.cache'\n"
    "\tlibvulkan.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libvulkan.so.1\n"
    "\tlibvulkan.so (libc6,x86-64) => /lib/x86_64-linux-gnu/libvulkan.so\n"
)
GLSLC = "shaderc v2023.2 v2023.2\nspirv-tools v2023.2 v2022.4-296-ge553b884\nglslang 11.1.0-763-g76b52ebf\n"


def test_fake_healthy_debian_cpu_only(tmp_path):
    fake = Fake(BASE)
    r = fake.doctor(tmp_path)
    assert r.tool("c-compiler").version == "12.2.0" and r.tool("c-compiler").detail == "gcc"
    assert r.tool("cmake").version == "3.25.1"
    assert r.backend("cpu").buildable
    assert not r.backend("cuda").buildable
    assert any("nvcc missing" in x for x in r.backend("cuda").reasons)
    assert r.tool("metal").status == "not applicable" and not r.backend("metal").buildable
    # every subprocess got a timeout, and it is the documented one
    assert fake.calls and all(kw.get("timeout") == VERSION_TIMEOUT_S == 10 for _, kw in fake.calls)
    json.dumps(r.to_dict())


def test_vulkan_headers_1_3_239_build_with_patch_0001(tmp_path):
    # Debian 12's headers lack VK_EXT_layer_settings, which upstream's ggml-vulkan needs; patch 0001 builds without
    # it (bench/results/vulkan-lavapipe-turbo/ built the Vulkan backend on them), so they do not block
    root = vulkan_root(tmp_path, 3, 239, layer_settings=False)
    fake = Fake({**BASE, "glslc": GLSLC, "ldconfig": LDCONFIG_VULKAN})
    r = fake.doctor(tmp_path, fs_root=root)
    t = r.tool("vulkan-headers")
    assert t.found and t.status == "ok" and t.version == "1.3.239", t
    assert t.path == "/usr/include/vulkan/vulkan_core.h"
    assert "no VK_EXT_layer_settings (< 1.3.268)" in t.detail and "patch 0001" in t.detail
    assert r.tool("glslc").status == "ok" and r.tool("glslc").version == "2023.2"
    assert r.tool("vulkan-loader").status == "ok"
    assert r.tool("spirv-headers").status == "ok" and r.tool("spirv-headers").version == "1.5.5"
    vk = r.backend("vulkan")
    assert vk.buildable and vk.reasons == [], vk
    assert r.backend("cpu").buildable


def test_vulkan_header_injected_path(tmp_path):
    hdr = _touch(tmp_path / "sdk/include/vulkan/vulkan_core.h", vulkan_core(3, 239, False))
    _touch(hdr.parent / "vulkan.hpp")
    r = Fake(BASE).doctor(tmp_path, vulkan_header=hdr)
    assert r.tool("vulkan-headers").status == "ok" and r.tool("vulkan-headers").version == "1.3.239"
    assert r.tool("vulkan-headers").path == str(hdr)
    hdr.with_name("vulkan.hpp").unlink()          # the C++ bindings are needed
    r = Fake(BASE).doctor(tmp_path, vulkan_header=hdr)
    assert r.tool("vulkan-headers").status == "missing" and "vulkan.hpp" in r.tool("vulkan-headers").detail
    r = Fake(BASE).doctor(tmp_path, vulkan_header=tmp_path / "nope/vulkan_core.h")
    assert r.tool("vulkan-headers").status == "missing"
    assert r.tool("vulkan-headers").fix == "apt-get install libvulkan-dev"


def test_vulkan_new_headers_buildable(tmp_path):
    root = vulkan_root(tmp_path, 4, 309, layer_settings=True)
    r = Fake({**BASE, "glslc": GLSLC, "ldconfig": LDCONFIG_VULKAN}).doctor(tmp_path, fs_root=root)
    assert r.tool("vulkan-headers").status == "ok" and r.tool("vulkan-headers").version == "1.4.309"
    assert r.tool("vulkan-headers").detail is None
    vk = r.backend("vulkan")
    assert vk.buildable and vk.reasons == [], vk
    assert any(n.startswith("turbo caches: kernels match the CPU") for n in vk.notes)
    assert not any(n.startswith("no turbo kernels") for n in vk.notes)


def test_vulkan_layer_settings_define_is_what_counts(tmp_path):
    # a header that claims a new version but lacks the extension is reported as lacking it (and still builds)
    root = vulkan_root(tmp_path, 3, 300, layer_settings=False)
    r = Fake({**BASE, "glslc": GLSLC, "ldconfig": LDCONFIG_VULKAN}).doctor(tmp_path, fs_root=root)
    t = r.tool("vulkan-headers")
    assert t.status == "ok" and t.detail.startswith("no VK_EXT_layer_settings: builds with patch 0001")
    assert parse_vulkan_header(vulkan_core(3, 239, False)) == {"header_version": 239, "version": (1, 3, 239),
                                                              "layer_settings": False}
    assert VK_LAYER_SETTINGS_MIN_HEADER > (1, 3, 239)


def test_vulkan_gaps_named_with_packages(tmp_path):
    root = tmp_path / "root"
    _touch(root / "usr/include/vulkan/vulkan_core.h", vulkan_core(4, 309, True))
    _touch(root / "usr/include/vulkan/vulkan.hpp")
    _touch(root / "usr/lib/x86_64-linux-gnu/libvulkan.so.1")  # runtime only, no dev symlink
    ldconfig = "\tlibvulkan.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libvulkan.so.1\n"
    r = Fake({**BASE, "ldconfig": ldconfig}).doctor(tmp_path, fs_root=root)
    vk = r.backend("vulkan")
    assert not vk.buildable
    assert "apt-get install glslc" in vk.fixes
    assert "apt-get install spirv-headers" in vk.fixes
    assert "apt-get install libvulkan-dev" in vk.fixes
    assert "libvulkan.so.1" in r.tool("vulkan-loader").detail


def test_vulkan_needs_newer_cmake_than_cpu(tmp_path):
    root = vulkan_root(tmp_path, 4, 309, layer_settings=True)
    r = Fake({**BASE, "cmake": CMAKE.format("3.16.3"), "glslc": GLSLC, "ldconfig": LDCONFIG_VULKAN}).doctor(
        tmp_path, fs_root=root)
    assert r.tool("cmake").status == "ok"  # fine for the CPU build (>= 3.14)
    assert r.backend("cpu").buildable
    vk = r.backend("vulkan")
    assert not vk.buildable and any(f"< {'.'.join(map(str, MIN_CMAKE_VULKAN))}" in x for x in vk.reasons)
    assert "pip install -U cmake" in vk.fixes


HIPCC_52 = ("HIP version: 5.2.21153-0\nDebian clang version 15.0.6\nTarget: x86_64-pc-linux-gnu\n"
            "Thread model: posix\nInstalledDir: /usr/lib/llvm-15/bin\n")


def test_hipcc_5_2_too_old(tmp_path):
    r = Fake({**BASE, "hipcc": HIPCC_52}).doctor(tmp_path)
    hip = r.tool("hip")
    assert hip.found and hip.status == "too old", hip
    assert hip.version.startswith("5.2")
    assert "6.1" in hip.fix
    assert r.tool("hipblas").status == "missing" and r.tool("rocblas").status == "missing"
    v = r.backend("hip")
    assert not v.buildable
    assert any("hip too old" in x for x in v.reasons)
    assert any("hipblas missing" in x for x in v.reasons) and any("rocblas missing" in x for x in v.reasons)
    assert any("hipblas-dev" in f for f in v.fixes)


def test_hip_6_1_with_blas_buildable(tmp_path):
    root = tmp_path / "root"
    for lib, ver in (("hipblas", "2.1.0"), ("rocblas", "4.1.0")):
        d = root / f"opt/rocm/lib/cmake/{lib}"
        _touch(d / f"{lib}-config.cmake")
        _touch(d / f"{lib}-config-version.cmake", f'set(PACKAGE_VERSION "{ver}")\n')
    r = Fake({**BASE, "hipconfig": "6.1.40091-a8dbc0c19", "hipcc": HIPCC_52}).doctor(tmp_path, fs_root=root)
    assert r.tool("hip").status == "ok" and r.tool("hip").version == "6.1.40091"
    assert r.tool("hipblas").version == "2.1.0" and r.tool("rocblas").path.startswith("/opt/rocm/")
    assert r.backend("hip").buildable, r.backend("hip")


def test_missing_cmake_blocks_cpu_with_package_fix(tmp_path):
    tools = dict(BASE)
    del tools["cmake"]
    r = Fake(tools).doctor(tmp_path)
    cm = r.tool("cmake")
    assert not cm.found and cm.status == "missing" and cm.path is None
    assert cm.fix == "apt-get install cmake (or: pip install cmake)"
    cpu = r.backend("cpu")
    assert not cpu.buildable
    assert cpu.reasons == ["cmake missing"]
    assert any("apt-get install cmake" in f and "pip install cmake" in f for f in cpu.fixes)
    # every other backend inherits the gap
    assert all(not b.buildable for b in r.backends)
    assert "NOT buildable" in format_report(r)


def test_missing_ninja_is_only_a_note(tmp_path):
    tools = dict(BASE)
    del tools["ninja"]
    r = Fake(tools).doctor(tmp_path)
    assert r.tool("ninja").status == "missing" and r.tool("ninja").optional
    assert r.tool("ninja").fix == "apt-get install ninja-build (or: pip install ninja)"
    cpu = r.backend("cpu")
    assert cpu.buildable and any("ninja" in n for n in cpu.notes)


def test_failing_version_commands_are_reported_not_raised(tmp_path):
    tools = {
        **BASE,
        "cmake": subprocess.TimeoutExpired(["cmake", "--version"], VERSION_TIMEOUT_S),
        "git": PermissionError(13, "Permission denied"),
        "ninja": RuntimeError("boom"),
        "nvcc": (1, "nvcc fatal: something\n"),
        "glslc": "no version here\n",
        "nvidia-smi": (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"),
        "ldconfig": OSError("ldconfig broke"),
    }
    r = Fake(tools).doctor(tmp_path)
    cm = r.tool("cmake")
    assert cm.found and cm.status == "error" and "timed out after 10s" in cm.detail
    assert r.tool("git").status == "error" and "Permission denied" in r.tool("git").detail
    assert r.tool("ninja").status == "error" and "boom" in r.tool("ninja").detail
    assert r.tool("nvcc").status == "error" and "exited with 1" in r.tool("nvcc").detail
    assert r.tool("glslc").status == "unknown" and r.tool("glslc").version is None
    smi = r.tool("nvidia-smi")
    assert smi.status == "error" and r.gpus == []
    assert r.tool("vulkan-loader").status == "missing"
    cpu = r.backend("cpu")
    assert not cpu.buildable and any("cmake error" in x for x in cpu.reasons)
    json.dumps(r.to_dict())
    format_report(r)


def test_everything_broken_never_raises(tmp_path):
    def which(name):
        raise RuntimeError("which exploded")

    def run(*a, **kw):
        raise RuntimeError("run exploded")

    r = run_doctor(which=which, run=run, platform="linux", env={}, fs_root=tmp_path)
    assert all(t.status in ("missing", "not applicable") for t in r.tools), [(t.name, t.status) for t in r.tools]
    assert not any(b.buildable for b in r.backends)
    json.dumps(r.to_dict())

    # every tool found, every command hanging
    r = run_doctor(which=lambda n: f"/bin/{n}",
                   run=lambda argv, **kw: (_ for _ in ()).throw(subprocess.TimeoutExpired(argv, kw["timeout"])),
                   platform="linux", env={}, fs_root=tmp_path)
    assert r.tool("c-compiler").status == "error" and "timed out" in r.tool("c-compiler").detail
    assert r.tool("hip").status == "error"
    assert not r.backend("cpu").buildable


@pytest.mark.parametrize("banner, flavour, version, status", [
    ("gcc (GCC) 8.5.0 20210514 (Red Hat 8.5.0-4)\nCopyright (C) 2018 Free Software Foundation, Inc.\n",
     "gcc", "8.5.0", "too old"),
    ("cc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0\nCopyright (C) 2021 Free Software Foundation, Inc.\n",
     "gcc", "11.4.0", "ok"),
    ("Debian clang version 14.0.6\nTarget: x86_64-pc-linux-gnu\n", "clang", "14.0.6", "ok"),
    ("clang version 9.0.1 \nTarget: x86_64-pc-linux-gnu\n", "clang", "9.0.1", "too old"),
    ("Apple clang version 15.0.0 (clang-1500.3.9.4)\nTarget: arm64-apple-darwin23.4.0\n",
     "apple-clang", "15.0.0", "ok"),
])
def test_compiler_flavours(tmp_path, banner, flavour, version, status):
    r = Fake({**BASE, "cc": banner}).doctor(tmp_path)
    t = r.tool("c-compiler")
    assert (t.version, t.status) == (version, status), t
    assert flavour in (t.detail or "")
    assert r.backend("cpu").buildable == (status == "ok")


def test_cc_env_var_wins(tmp_path):
    fake = Fake({**BASE, "clang": "Debian clang version 14.0.6\n"})
    r = fake.doctor(tmp_path, env={"CC": "clang -fuse-ld=lld"})
    assert r.tool("c-compiler").path == "/fake/bin/clang" and r.tool("c-compiler").detail == "clang"


NVCC_124 = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 12.4, V12.4.131\n"


def test_cuda_with_gpus_parsed(tmp_path):
    smi = "NVIDIA H200, 9.0, 143771 MiB, 143164 MiB\nTesla P40, 6.1, 24576 MiB, [N/A]\n"
    fake = Fake({**BASE, "nvcc": NVCC_124, "nvidia-smi": smi})
    r = fake.doctor(tmp_path)
    assert r.tool("nvcc").version == "12.4.131" and r.tool("nvcc").status == "ok"
    assert r.gpus[0] == {"vendor": "nvidia", "name": "NVIDIA H200", "compute_cap": "9.0", "cuda_arch": "90",
                         "memory_total_mib": 143771, "memory_free_mib": 143164}
    assert r.gpus[1]["memory_free_mib"] is None
    smi_call = next(argv for argv, _ in fake.calls if argv[0].endswith("nvidia-smi"))
    assert smi_call[1:] == ["--query-gpu=name,compute_cap,memory.total,memory.free", "--format=csv,noheader"]
    cuda = r.backend("cuda")
    assert cuda.buildable and any("61;90" in n for n in cuda.notes)
    assert "NVIDIA H200" in format_report(r)


def test_cuda_without_gpu_is_buildable_with_arch_hint(tmp_path):
    r = Fake({**BASE, "nvcc": NVCC_124}).doctor(tmp_path)
    cuda = r.backend("cuda")
    assert cuda.buildable and r.gpus == []
    assert any("--cuda-arch" in n for n in cuda.notes)


def test_cuda_too_old(tmp_path):
    old = "Cuda compilation tools, release 11.4, V11.4.48\n"
    r = Fake({**BASE, "nvcc": old}).doctor(tmp_path)
    assert r.tool("nvcc").status == "too old"
    assert not r.backend("cuda").buildable


def test_metal_on_darwin(tmp_path):
    def xcrun(argv):
        if "--show-sdk-path" in argv:
            return "/Library/Developer/CommandLineTools/SDKs/MacOSX.sdk\n"
        if "--show-sdk-version" in argv:
            return "14.4\n"
        return (1, "xcrun: error: unable to find utility \"metal\", not a developer tool or in PATH\n")

    apple = "Apple clang version 15.0.0 (clang-1500.3.9.4)\n"
    r = Fake({**BASE, "cc": apple, "c++": apple, "xcrun": xcrun}).doctor(tmp_path, platform="darwin")
    sdk = r.tool("xcode-sdk")
    assert sdk.status == "ok" and sdk.version == "14.4"
    assert r.tool("metal").status == "missing" and r.tool("metal").optional
    assert r.backend("metal").buildable
    assert any(n.startswith("no turbo kernels") for n in r.backend("metal").notes)
    assert r.tool("cmake").status == "ok"

    tools = dict(BASE)
    del tools["cmake"]
    r = Fake(tools).doctor(tmp_path, platform="darwin")
    assert r.tool("cmake").fix == "brew install cmake"
    assert r.tool("xcode-sdk").status == "missing" and r.tool("xcode-sdk").fix == "xcode-select --install"
    assert not r.backend("metal").buildable


@pytest.mark.parametrize("machine,cpuinfo,expect", [
    ("aarch64", None, "NEON code of patch 0058"),
    ("arm64", None, "NEON code of patch 0058"),  # macOS
    ("x86_64", "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\nvmx flags\t: ept\n", "AVX2 code of patches 0003 and 0009 on this CPU"),
    ("x86_64", "processor\t: 0\nflags\t\t: fpu sse2 sse4_2 avx\n", "this CPU has no AVX2: turbo caches run ggml's generic C code"),
    ("x86_64", None, "where the CPU has AVX2"),  # no /proc/cpuinfo (macOS)
    ("x86_64", "processor\t: 0\nvmx flags\t: ept\n", "where the CPU has AVX2"),  # no flags line to read
    ("riscv64", None, "riscv64: turbo caches run ggml's generic C code"),
    ("", None, "unknown machine: turbo caches run ggml's generic C code"),
])
def test_cpu_turbo_note(tmp_path, machine, cpuinfo, expect):
    """The cpu backend says which turbo code a native build runs on this CPU: AVX2, NEON, or the generic C code."""
    root = tmp_path / "root"
    if cpuinfo is not None:
        _touch(root / "proc" / "cpuinfo", cpuinfo)
    r = Fake(BASE).doctor(tmp_path, fs_root=root, machine=machine)
    notes = r.backend("cpu").notes
    assert any(expect in n for n in notes), notes
    assert r.backend("cpu").buildable
