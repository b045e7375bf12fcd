#!/usr/bin/env bash
# A Vulkan SDK overlay with cooperative-matrix support, for scripts/h200_vulkan.sh (VK_SDK_OVERLAY).
#
# Debian 12's glslc (shaderc 2023.2, glslang 11.13) knows no cooperative-matrix extension, so a Vulkan build made
# with it gives every GPU the scalar flash-attention shader, f16 included ("matrix cores: none"), which is not what a
# user with a current SDK gets. This script fetches Debian 13's glslc (shaderc 2025.2, glslang 15.1), Vulkan headers
# 1.4.309 and SPIR-V headers into an overlay of the SDK that scripts/prepare_h200.py --vulkan packs. Debian 13's
# glslc needs glibc 2.38 and libstdc++ 13, newer than Debian 12's, so the overlay carries Debian 13's libc, libstdc++,
# libgcc and loader in glslc-root/ and bin/glslc runs glslc through that loader; nothing else sees those libraries.
#
#   bash bench/experiments/vulkan-sdk-trixie.sh [OUT.tar.gz]     (default .h200/vulkan-sdk-trixie.tar.gz)
#
# then, on the device: VK_SDK_OVERLAY=.h200/vulkan-sdk-trixie.tar.gz bash scripts/h200_vulkan.sh build ...
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUTF=${1:-$ROOT/.h200/vulkan-sdk-trixie.tar.gz}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/lists" "$W/cache" "$W/debs" "$W/root"
echo "deb [trusted=yes] http://deb.debian.org/debian trixie main" > "$W/sources.list"
A=(-o Dir::Etc::SourceList="$W/sources.list" -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists="$W/lists"
   -o Dir::Cache="$W/cache" -o Debug::NoLocking=1)
apt-get "${A[@]}" update > "$W/update.log" 2>&1 || { tail -5 "$W/update.log"; exit 1; }
pkgs=(glslc libshaderc1 libvulkan-dev libvulkan1 spirv-headers libc6 libstdc++6 libgcc-s1)
for p in "${pkgs[@]}"; do
    # the newest version in trixie (the system's own lists would offer Debian 12's too)
    v=$(apt-cache "${A[@]}" madison "$p" | awk -F'|' '$3 ~ /trixie/ {gsub(/ /, "", $2); print $2; exit}')
    [ -n "$v" ] || { echo "no $p in trixie" >&2; exit 1; }
    (cd "$W/debs" && apt-get "${A[@]}" download "$p=$v" > /dev/null 2>&1) || { echo "download of $p=$v failed" >&2; exit 1; }
    echo "$p $v"
done | tee "$W/versions.txt"
for f in "$W"/debs/*.deb; do dpkg -x "$f" "$W/root"; done

S=$W/sdk
L=usr/lib/x86_64-linux-gnu
mkdir -p "$S/include" "$S/share/cmake" "$S/bin" "$S/glslc-root/usr/bin" "$S/glslc-root/$L"
cp -a "$W/root/usr/include/vulkan" "$W/root/usr/include/vk_video" "$W/root/usr/include/spirv" "$S/include/"
# (headers that neither vulkan.hpp nor ggml-vulkan include, as prepare_h200.py leaves them out)
rm -f "$S"/include/vulkan/{vulkan_raii.hpp,vulkan_hash.hpp,vulkan_static_assertions.hpp,vulkan_format_traits.hpp,vulkan_shared.hpp,vulkan.cppm}
rm -rf "$S"/include/spirv/{1.0,1.1,1.2} "$S"/include/spirv/unified1/spir-v.xml
cp -a "$W/root/usr/share/cmake/SPIRV-Headers" "$S/share/cmake/"
cp -a "$W/root/usr/bin/glslc" "$S/glslc-root/usr/bin/"
for lib in ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 libgcc_s.so.1 libshaderc.so.1 \
           'libshaderc.so.1.*' libstdc++.so.6 'libstdc++.so.6.*'; do
    cp -a "$W/root/$L"/$lib "$S/glslc-root/$L/" 2>/dev/null || true
done
cat > "$S/bin/glslc" <<'EOF'
#!/bin/sh
# Debian 13's glslc through its own loader and libraries (glibc 2.38+, libstdc++ 13+)
R=$(cd "$(dirname "$0")/../glslc-root" && pwd)
L=$R/usr/lib/x86_64-linux-gnu
exec "$L/ld-linux-x86-64.so.2" --library-path "$L" "$R/usr/bin/glslc" "$@"
EOF
chmod +x "$S/bin/glslc"
cp "$W/versions.txt" "$S/versions.txt"
"$S/bin/glslc" --version | head -3
mkdir -p "$(dirname "$OUTF")"
tar -czf "$OUTF" -C "$W/sdk" .
echo "wrote $OUTF ($(du -h "$OUTF" | cut -f1))"
