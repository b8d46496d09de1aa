#!/bin/sh
# build.sh BINARY VERSION OUTDIR [GOARCH] builds the tribe .deb with
# dpkg-deb from a built binary and writes OUTDIR/tribe_<version>_<arch>.deb;
# it prints the file's path. VERSION is the agent's (git describe without
# the "v"); debversion.sh derives the Debian version from it. Run by `make
# package`. DEB_COMPRESSION picks dpkg-deb's compressor: xz (the default,
# smallest) or gzip (several times faster).
set -eu

if [ $# -lt 3 ]; then
	echo "usage: $0 BINARY VERSION OUTDIR [GOARCH]" >&2
	exit 2
fi
bin=$1 version=$2 out=$3 goarch=${4:-$(go env GOARCH)}
here=$(cd "$(dirname "$0")" && pwd)
pkg=$(cd "$here/.." && pwd)      # cmd/tribe/packaging
top=$(cd "$pkg/../../.." && pwd) # the repository

command -v dpkg-deb >/dev/null 2>&1 || {
	echo "build.sh: dpkg-deb not found; install dpkg (apt-get install dpkg)" >&2
	exit 1
}

debversion=$("$here/debversion.sh" "$version")

case $goarch in
amd64 | arm64 | riscv64 | s390x | loong64 | mips64el) arch=$goarch ;;
386) arch=i386 ;;
arm) arch=armhf ;;
ppc64le) arch=ppc64el ;;
*)
	echo "build.sh: no Debian architecture for GOARCH $goarch" >&2
	exit 1
	;;
esac

stage=$(mktemp -d)
chmod 0755 "$stage"
trap 'rm -rf "$stage"' EXIT
umask 022
install -D -m 0755 "$bin" "$stage/usr/bin/tribe"
install -D -m 0644 "$pkg/tribe.service" "$stage/lib/systemd/system/tribe.service"
# Config may name trusted writers and exec commands: not world-readable.
install -D -m 0640 "$pkg/agent.yaml" "$stage/etc/tribe/agent.yaml"
install -D -m 0644 "$pkg/default" "$stage/etc/default/tribe"
install -D -m 0644 "$top/LICENSE" "$stage/usr/share/doc/tribe/copyright"

mkdir -p "$stage/DEBIAN"
for s in postinst prerm postrm; do
	install -m 0755 "$here/$s" "$stage/DEBIAN/$s"
done
printf '%s\n' /etc/default/tribe /etc/tribe/agent.yaml >"$stage/DEBIAN/conffiles"
(cd "$stage" && find usr lib -type f -exec md5sum {} + | sort -k 2) >"$stage/DEBIAN/md5sums"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<CONTROL
Package: tribe
Version: $debversion
Architecture: $arch
Maintainer: The tribe authors <tribe@tribeagent.invalid>
Installed-Size: $size
Depends: passwd, procps
Section: admin
Priority: optional
Homepage: https://github.com/tribeagent/tribe
Description: masterless fleet agent
 tribe runs on every host of a fleet as an equal peer: hosts find each
 other, fall into named groups (tribes) by CEL policies over their facts,
 share state as signed CRDT entries over libp2p, and call plugins on each
 other. Any host is a CLI entry point for the whole fleet.
 .
 The package installs the agent as the systemd unit tribe.service, running
 as user tribe with its state in /var/lib/tribe. It enables nothing: edit
 /etc/tribe/agent.yaml, then run systemctl enable --now tribe.
CONTROL

mkdir -p "$out"
deb="$out/tribe_${debversion}_${arch}.deb"
dpkg-deb --root-owner-group -Z"${DEB_COMPRESSION:-xz}" --build "$stage" "$deb" >/dev/null
echo "$deb"
