package external

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/tribeagent/tribe/internal/fsperm"
	"github.com/tribeagent/tribe/plugins"
	"github.com/tribeagent/tribe/plugins/external/wire"
)

// Find lists the plugins in dir, name to path: the executable regular
// files whose names are plugin names. Anything else in dir but a dir is
// skipped and said so in skipped; a dir that does not exist holds no
// plugins.
func Find(dir string) (found map[string]string, skipped []error, err error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]string{}, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("plugin dir: %w", err)
	}
	if fi, err := os.Stat(dir); err != nil {
		return nil, nil, fmt.Errorf("plugin dir: %w", err)
	} else if why := fsperm.Unsafe(fi); why != "" {
		return nil, nil, fmt.Errorf("plugin dir %s is %s: anyone who can write it could run code as the agent", dir, why)
	}
	found = map[string]string{}
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		fi, err := os.Stat(path) // through a symlink
		switch {
		case err != nil:
			skipped = append(skipped, fmt.Errorf("%s: %w", path, err))
		case fi.IsDir():
			// Not a plugin, and no mistake either: the agent keeps the
			// plugins trusted writers share in shared/.
		case !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0:
			skipped = append(skipped, fmt.Errorf("%s: not an executable file", path))
		case fsperm.Unsafe(fi) != "":
			skipped = append(skipped, fmt.Errorf("%s: %s: anyone who can write it could run code as the agent", path, fsperm.Unsafe(fi)))
		case !wire.ValidName(e.Name()):
			skipped = append(skipped, fmt.Errorf("%s: %q is not a plugin name (lower-case letters, digits, '.', '_' and '-', at most 63)", path, e.Name()))
		default:
			found[e.Name()] = path
		}
	}
	return found, skipped, nil
}

// Factory loads the plugin at path: each loaded instance (one per tribe)
// is a process of its own. External plugins take no load config.
func Factory(path string, cfg Config) plugins.Factory {
	return func(config map[string]string) (plugins.Plugin, error) {
		if len(config) > 0 {
			return nil, fmt.Errorf("an external plugin takes no config (got %v)", slices.Sorted(maps.Keys(config)))
		}
		return Start(path, cfg)
	}
}
