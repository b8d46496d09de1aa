package node

import (
	"path/filepath"

	"github.com/tribeagent/tribe/plugins"
	"github.com/tribeagent/tribe/plugins/external"
)

// pluginDir is where this host's external plugins are.
func (n *Node) pluginDir() string {
	if n.cfg.PluginDir != "" {
		return n.cfg.PluginDir
	}
	return filepath.Join(n.cfg.DataDir, "plugins")
}

// registerLocalPlugins adds the executables of the plugin dir to the
// registry (plugins/external runs them), each under its file name. A
// name a built-in has is skipped, said so in the log; so is anything in
// the dir that is not a plugin.
func (n *Node) registerLocalPlugins() {
	dir := n.pluginDir()
	found, skipped, err := external.Find(dir)
	if err != nil {
		n.log.Warn("reading the plugin dir; no external plugins", "dir", dir, "err", err)
		return
	}
	for _, err := range skipped {
		n.log.Warn("not a plugin; skipped", "err", err)
	}
	for name, path := range found {
		if n.registry.Has(name) {
			n.log.Warn("an external plugin has the name of a built-in; skipped", "plugin", name, "path", path)
			continue
		}
		n.registry.RegisterFrom(name, plugins.SourceLocal, external.Factory(path, n.externalConfig()))
		n.log.Info("external plugin found", "plugin", name, "path", path)
	}
}

// externalConfig is how this node runs an external plugin: its log, and
// a change in the plugin's health said in the node's record.
func (n *Node) externalConfig() external.Config {
	return external.Config{Log: n.log, OnChange: func() {
		if n.ctx != nil && n.ctx.Err() == nil {
			n.spawn(n.publishPluginStates)
		}
	}}
}

// publishPluginStates says in this node's record how its plugins are, if
// that changed (an external plugin crashed too often, or recovered).
func (n *Node) publishPluginStates() {
	if err := n.publishSelf(n.ctx); err != nil && n.ctx.Err() == nil {
		n.log.Warn("publishing plugin states", "err", err)
	}
}
