#!/bin/sh
# version.sh prints the version the build stamps into node.Version: the
# nearest v* tag as git describe says it (0.2.0, 0.2.0-5-gabc1234-dirty),
# else node.Version's default with the commit (0.1.0-dev+git.abc1234),
# else that default alone (a source tree without git).
set -eu
top=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$top"
if v=$(git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null); then
	echo "${v#v}"
	exit 0
fi
base=$(sed -n 's/^var Version = "\(.*\)"$/\1/p' node/node.go)
if c=$(git describe --always --dirty 2>/dev/null); then
	echo "$base+git.$(echo "$c" | sed 's/-dirty$/.dirty/')"
else
	echo "$base"
fi
