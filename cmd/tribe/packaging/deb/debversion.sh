#!/bin/sh
# debversion.sh VERSION prints the Debian version of an agent version (git
# describe without the "v"), so that dpkg orders builds as git does:
#   0.2.0                          -> 0.2.0
#   0.2.0-5-gabc1234[-dirty]       -> 0.2.0+5.gabc1234[.dirty]  (after 0.2.0)
#   0.2.0-rc1, 0.1.0-dev+git.abc   -> 0.2.0~rc1, 0.1.0~dev+git.abc (before)
set -eu
if [ $# -ne 1 ]; then
	echo "usage: $0 VERSION" >&2
	exit 2
fi
v=$(printf '%s\n' "$1" | sed \
	-e 's/-\([0-9][0-9]*\)-g\([0-9a-f][0-9a-f]*\)/+\1.g\2/' \
	-e 's/-dirty$/.dirty/' \
	-e 's/-/~/g')
case $v in
[0-9]*) ;;
*)
	echo "debversion.sh: version $1 does not start with a digit" >&2
	exit 1
	;;
esac
case $v in
*[!0-9A-Za-z.+~]*)
	echo "debversion.sh: version $1 has characters a Debian version cannot" >&2
	exit 1
	;;
esac
echo "$v"
