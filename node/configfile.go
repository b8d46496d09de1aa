package node

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tribeagent/tribe/internal/fsperm"
	"github.com/tribeagent/tribe/plugins"
)

// FileConfig is the agent's config file (--config), YAML or JSON. Every
// field is optional; a field that is set replaces the default, and a
// command-line flag replaces the file.
type FileConfig struct {
	Name        *string  `yaml:"name"`
	Cluster     *string  `yaml:"cluster"`
	Listen      []string `yaml:"listen"`
	Join        []string `yaml:"join"`
	MDNS        *bool    `yaml:"mdns"`
	SwarmKey    *string  `yaml:"swarm_key"`
	Trusted     []string `yaml:"trusted"`
	AutoAdmit   *string  `yaml:"auto_admit"`
	FactsFile   *string  `yaml:"facts_file"`
	TargetPeers *int     `yaml:"target_peers"`
	Exec        *struct {
		Commands map[string]plugins.Command `yaml:"commands"`
		AllowAny bool                       `yaml:"allow_any"`
	} `yaml:"exec"`
	FileDir       *string `yaml:"file_dir"`
	PluginDir     *string `yaml:"plugin_dir"`
	AcceptPlugins *string `yaml:"accept_plugins"`
	FileMaxBytes  *int64  `yaml:"file_max_bytes"`
	LogLevel      *string `yaml:"log_level"`
	LogFormat     *string `yaml:"log_format"`
	// ReconnectTimeout is a Go duration ("72h", "30m").
	ReconnectTimeout *time.Duration `yaml:"reconnect_timeout"`
	MetricsAddr      *string        `yaml:"metrics_addr"`
	ConnsPerIP       *int           `yaml:"conns_per_ip"`
	JobQueue         *int           `yaml:"job_queue"`
	JobRetention     *time.Duration `yaml:"job_retention"`
	Procs            *int           `yaml:"procs"`
}

// LoadConfigFile reads path and applies what it sets to cfg. Unknown keys
// are an error, so a typo never goes unnoticed. A file that group or
// others may write, or that another user owns, is refused: it names the
// trusted writers, the exec commands and the plugin dir, so whoever could
// write it could run commands as the agent at its next start or reload.
func LoadConfigFile(path string, cfg *Config) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("node: config file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("node: config file: %w", err)
	}
	if why := fsperm.Unsafe(fi); why != "" {
		return fmt.Errorf("node: config file %s is %s: whoever could write it could run commands as the agent", path, why)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return fmt.Errorf("node: config file: %w", err)
	}
	var fc FileConfig
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("node: config file %s: %w", path, err)
	}
	// A second document (after ---) would be read by no one: an error,
	// not settings silently left out. An empty one is nothing.
	for {
		var extra yaml.Node
		err := dec.Decode(&extra)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil || len(extra.Content) != 1 || extra.Content[0].Tag != "!!null" {
			return fmt.Errorf("node: config file %s: more than one YAML document (a --- line): put every setting in one", path)
		}
	}
	set(&cfg.Name, fc.Name)
	set(&cfg.Cluster, fc.Cluster)
	set(&cfg.MDNS, fc.MDNS)
	set(&cfg.SwarmKeyFile, fc.SwarmKey)
	set(&cfg.TargetPeers, fc.TargetPeers)
	set(&cfg.FactsFile, fc.FactsFile)
	set(&cfg.AutoAdmit, fc.AutoAdmit)
	if fc.Listen != nil {
		cfg.ListenAddrs = fc.Listen
	}
	if fc.Join != nil {
		cfg.Join = fc.Join
	}
	if fc.Trusted != nil {
		cfg.Trusted = fc.Trusted
	}
	if fc.Exec != nil {
		cfg.Exec = plugins.ExecConfig{Commands: fc.Exec.Commands, AllowAny: fc.Exec.AllowAny}
	}
	set(&cfg.FileDir, fc.FileDir)
	set(&cfg.PluginDir, fc.PluginDir)
	set(&cfg.AcceptPlugins, fc.AcceptPlugins)
	set(&cfg.FileMaxBytes, fc.FileMaxBytes)
	set(&cfg.LogLevel, fc.LogLevel)
	set(&cfg.LogFormat, fc.LogFormat)
	set(&cfg.ReconnectTimeout, fc.ReconnectTimeout)
	set(&cfg.MetricsAddr, fc.MetricsAddr)
	set(&cfg.ConnsPerIP, fc.ConnsPerIP)
	set(&cfg.JobQueue, fc.JobQueue)
	set(&cfg.JobRetention, fc.JobRetention)
	set(&cfg.Procs, fc.Procs)
	return nil
}

func set[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}
