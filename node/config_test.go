package node

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const validJoin = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWJveGj4FtLxPTCvQzyzUweLC22uto2brEtE4pTkK6xNCj"

func validConfig() Config {
	c := DefaultConfig()
	c.DataDir = "/tmp/x"
	return c
}

func TestDefaultConfigIsValidOnceDataDirIsSet(t *testing.T) {
	if err := validConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if err := DefaultConfig().Validate(); err == nil || !strings.Contains(err.Error(), "data dir") {
		t.Fatalf("default config without a data dir: %v", err)
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name   string
		change func(*Config)
		want   string // "" means valid
	}{
		{"join with peer id", func(c *Config) { c.Join = []string{validJoin} }, ""},
		{"listen port 0", func(c *Config) { c.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"} }, ""},
		{"bad listen", func(c *Config) { c.ListenAddrs = []string{"127.0.0.1:4001"} }, "listen address"},
		{"join tcp without peer id", func(c *Config) { c.Join = []string{"/ip4/127.0.0.1/tcp/4001"} }, ""},
		{"join host:port", func(c *Config) { c.Join = []string{"host.example:4001", "127.0.0.1:4001", "[::1]:4001"} }, ""},
		{"join quic without peer id", func(c *Config) { c.Join = []string{"/ip4/127.0.0.1/udp/4001/quic-v1"} }, "no /p2p/"},
		{"join host without port", func(c *Config) { c.Join = []string{"host.example"} }, "join address"},
		{"join bad port", func(c *Config) { c.Join = []string{"host.example:99999"} }, "1 to 65535"},
		{"join bad host", func(c *Config) { c.Join = []string{"bad host!:4001"} }, "neither an IP address nor a DNS name"},
		{"join bad multiaddr", func(c *Config) { c.Join = []string{"/ip4/300.0.0.1/tcp/4001"} }, "join address"},
		{"empty cluster", func(c *Config) { c.Cluster = "" }, "cluster"},
		{"cluster with spaces", func(c *Config) { c.Cluster = "my cluster" }, "cluster"},
		{"cluster too long", func(c *Config) { c.Cluster = strings.Repeat("a", 33) }, "cluster"},
		{"name with newline", func(c *Config) { c.Name = "a\nb" }, "name"},
		{"name with an escape sequence", func(c *Config) { c.Name = "a\x1b[2Kb" }, "printable text"},
		{"name with a right-to-left override", func(c *Config) { c.Name = "a\u202eb" }, "printable text"},
		{"name not in ASCII", func(c *Config) { c.Name = "kůň-7" }, ""},
		{"name of 64 bytes", func(c *Config) { c.Name = strings.Repeat("a", 64) }, ""},
		{"name of 65 bytes", func(c *Config) { c.Name = strings.Repeat("a", 65) }, "at most 64 bytes"},
		{"quic with swarm key", func(c *Config) {
			c.SwarmKeyFile = "k"
			c.ListenAddrs = []string{"/ip4/0.0.0.0/udp/4001/quic-v1"}
		}, "QUIC cannot use a swarm key"},
		{"tcp with swarm key", func(c *Config) {
			c.SwarmKeyFile = "k"
			c.ListenAddrs = []string{"/ip4/0.0.0.0/tcp/4001"}
		}, ""},
		{"zero target", func(c *Config) { c.TargetPeers = 0 }, "target peers"},
		{"target of ConnHigh", func(c *Config) { c.TargetPeers = c.ConnHigh }, ""},
		{"target past ConnHigh", func(c *Config) { c.TargetPeers = c.ConnHigh + 1 }, "target peers"},
		{"huge target", func(c *Config) { c.TargetPeers = 1 << 62 }, "target peers"},
		{"accept plugins from anyone", func(c *Config) { c.AcceptPlugins = AcceptTrusted }, "needs trusted writers"},
		{"accept plugins, unknown value", func(c *Config) { c.AcceptPlugins = "all" }, "accept plugins"},
		{"accept plugins from trusted writers", func(c *Config) {
			c.AcceptPlugins, c.Trusted = AcceptTrusted, []string{"12D3KooWJveGj4FtLxPTCvQzyzUweLC22uto2brEtE4pTkK6xNCj"}
		}, ""},
		{"water marks", func(c *Config) { c.ConnLow, c.ConnHigh = 10, 5 }, "water marks"},
		{"backoff order", func(c *Config) { c.BackoffMax = c.BackoffMin / 2 }, "maximum backoff"},
		{"zero interval", func(c *Config) { c.DiscoveryInterval = 0 }, "discovery interval"},
		{"zero reconnect timeout", func(c *Config) { c.ReconnectTimeout = 0 }, "reconnect timeout must be positive"},
		{"negative leave timeout", func(c *Config) { c.LeaveTimeout = -time.Second }, "leave timeout must be positive"},
		{"negative file cap", func(c *Config) { c.FileMaxBytes = -1 }, "file plugin size cap"},
		{"json logs", func(c *Config) { c.LogLevel, c.LogFormat = "warn", "json" }, ""},
		{"bad log level", func(c *Config) { c.LogLevel = "loud" }, `log level "loud": use debug, info, warn or error`},
		{"bad log format", func(c *Config) { c.LogFormat = "xml" }, `log format "xml": use text or json`},
		{"metrics address without a port", func(c *Config) { c.MetricsAddr = "9464" }, "metrics address \"9464\": want HOST:PORT"},
		{"metrics port not a number", func(c *Config) { c.MetricsAddr = "127.0.0.1:http" }, "port \"http\" is not a number"},
		{"metrics address", func(c *Config) { c.MetricsAddr = "127.0.0.1:0" }, ""},
		{"every core", func(c *Config) { c.Procs = 0 }, ""},
		{"four cores", func(c *Config) { c.Procs = 4 }, ""},
		{"negative procs", func(c *Config) { c.Procs = -1 }, "procs -1: a number of cores, or 0 for every core"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.change(&c)
			before := c.Join
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
			if len(c.Join) != len(before) {
				t.Fatal("Validate changed the config")
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := validConfig()
	c.Cluster = ""
	c.TargetPeers = 0
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "cluster") || !strings.Contains(err.Error(), "target peers") {
		t.Fatalf("err = %v, want both problems", err)
	}
}

func TestListenAddrsDefaultsDropQUICWithSwarmKey(t *testing.T) {
	c := validConfig()
	if got := len(c.listenAddrs()); got != 2 {
		t.Fatalf("default listen addrs: %d, want 2", got)
	}
	c.SwarmKeyFile = "k"
	addrs := c.listenAddrs()
	if len(addrs) != 1 || isQUIC(addrs[0]) {
		t.Fatalf("with a swarm key: %v, want TCP only", addrs)
	}
}

func TestLoadConfigFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tribe.yaml")
	os.WriteFile(path, []byte("name: web-1\ncluster: prod\nmdns: false\njoin: ["+validJoin+"]\ntarget_peers: 4\nfile_max_bytes: 1000\nlog_level: debug\nlog_format: json\nreconnect_timeout: 24h\nmetrics_addr: 127.0.0.1:9464\nprocs: 0\n"), 0o600)
	c := validConfig()
	if err := LoadConfigFile(path, &c); err != nil {
		t.Fatal(err)
	}
	if c.Name != "web-1" || c.Cluster != "prod" || c.MDNS || len(c.Join) != 1 || c.TargetPeers != 4 || c.FileMaxBytes != 1000 ||
		c.LogLevel != "debug" || c.LogFormat != "json" || c.ReconnectTimeout != 24*time.Hour ||
		c.MetricsAddr != "127.0.0.1:9464" || c.Procs != 0 {
		t.Fatalf("config file not applied: %+v", c)
	}
	if c.ListenAddrs != nil {
		t.Fatal("unset listen changed")
	}

	os.WriteFile(path, []byte("nmae: typo\n"), 0o600)
	if err := LoadConfigFile(path, &c); err == nil || !strings.Contains(err.Error(), "nmae") {
		t.Fatalf("typo in config file: %v", err)
	}
	os.WriteFile(path, []byte(`{"cluster": "json-works"}`), 0o600)
	if err := LoadConfigFile(path, &c); err != nil || c.Cluster != "json-works" {
		t.Fatalf("JSON config: %v, cluster %q", err, c.Cluster)
	}
	if err := LoadConfigFile(filepath.Join(dir, "missing.yaml"), &c); err == nil {
		t.Fatal("missing config file accepted")
	}
	// A second document would be read by no one: its trusted writers
	// would not be, and the agent start in an open fleet.
	os.WriteFile(path, []byte("cluster: x\n---\ntrusted: [bogus]\n"), 0o600)
	if err := LoadConfigFile(path, &c); err == nil || !strings.Contains(err.Error(), "more than one YAML document") {
		t.Fatalf("two documents: %v", err)
	}
	for _, one := range []string{"", "# only a comment\n", "cluster: y\n---\n", "---\ncluster: y\n"} {
		os.WriteFile(path, []byte(one), 0o600)
		if err := LoadConfigFile(path, &c); err != nil {
			t.Errorf("%q: %v", one, err)
		}
	}
}

func TestNewLoggerWritesJSON(t *testing.T) {
	var b strings.Builder
	log, err := NewLogger(&b, "warn", "json")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hidden")
	log.Warn("shown", "peer", "x")
	var line map[string]any
	if err := json.Unmarshal([]byte(b.String()), &line); err != nil || line["msg"] != "shown" || line["level"] != "WARN" || line["peer"] != "x" {
		t.Fatalf("%q: %v", b.String(), err)
	}
}

// A config file others may write is refused: it names the trusted
// writers, the exec commands and the plugin dir, so whoever could write
// it could run commands as the agent at its next reload.
func TestLoadConfigFileRefusesOneOthersMayWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tribe.yaml")
	if err := os.WriteFile(path, []byte("exec:\n  allow_any: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []os.FileMode{0o620, 0o602} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		c := validConfig()
		err := LoadConfigFile(path, &c)
		if err == nil || !strings.Contains(err.Error(), "writable by group or others") || c.Exec.AllowAny {
			t.Fatalf("mode %v: %v, allow_any %v", mode, err, c.Exec.AllowAny)
		}
	}
	os.Chmod(path, 0o644)
	c := validConfig()
	if err := LoadConfigFile(path, &c); err != nil || !c.Exec.AllowAny {
		t.Fatalf("mode 0644: %v", err)
	}
}
