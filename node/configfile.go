package node

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"go.yaml.in/yaml/v3"

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
// are an error, so a typo never goes unnoticed.
func LoadConfigFile(path string, cfg *Config) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("node: config file: %w", err)
	}
	var f FileConfig
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
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
	set(&cfg.Name, f.Name)
	set(&cfg.Cluster, f.Cluster)
	set(&cfg.MDNS, f.MDNS)
	set(&cfg.SwarmKeyFile, f.SwarmKey)
	set(&cfg.TargetPeers, f.TargetPeers)
	set(&cfg.FactsFile, f.FactsFile)
	set(&cfg.AutoAdmit, f.AutoAdmit)
	if f.Listen != nil {
		cfg.ListenAddrs = f.Listen
	}
	if f.Join != nil {
		cfg.Join = f.Join
	}
	if f.Trusted != nil {
		cfg.Trusted = f.Trusted
	}
	if f.Exec != nil {
		cfg.Exec = plugins.ExecConfig{Commands: f.Exec.Commands, AllowAny: f.Exec.AllowAny}
	}
	set(&cfg.FileDir, f.FileDir)
	set(&cfg.PluginDir, f.PluginDir)
	set(&cfg.AcceptPlugins, f.AcceptPlugins)
	set(&cfg.FileMaxBytes, f.FileMaxBytes)
	set(&cfg.LogLevel, f.LogLevel)
	set(&cfg.LogFormat, f.LogFormat)
	set(&cfg.ReconnectTimeout, f.ReconnectTimeout)
	set(&cfg.MetricsAddr, f.MetricsAddr)
	set(&cfg.ConnsPerIP, f.ConnsPerIP)
	set(&cfg.JobQueue, f.JobQueue)
	set(&cfg.JobRetention, f.JobRetention)
	set(&cfg.Procs, f.Procs)
	return nil
}

func set[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}
