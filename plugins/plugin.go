// Package plugins is what a tribe node runs when asked: the Plugin
// interface, the Registry of plugins a host knows how to build, the
// built-ins (exec, sys, facts, echo, file), and the remote-call protocol
// (ProtocolID) over libp2p streams.
//
// Drive it like this: build a Registry with Builtins(env); Load an
// Instance for each (tribe, plugin) the replicated state asks this node to
// run; serve calls with a Server, whose Authorizer (the node) decides which
// Instance, if any, a caller may reach; call other nodes with a Caller
// (which keeps streams open between calls) or Call, many at once with
// FanOut.
//
//	plugin.go   the interface, the registry, loaded instances and their limits
//	builtin*.go the built-in plugins
//	wire.go     request and response, framing, error codes
//	server.go   the callee side of the protocol
//	client.go   the caller side: Caller, Call and FanOut
//	kept.go     the streams a Caller keeps between calls
package plugins

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
)

// Kind says what a plugin is for.
type Kind string

const (
	Collector Kind = "collector" // gathers data from the host (sys, facts)
	Processor Kind = "processor" // transforms what it is given (echo)
	Publisher Kind = "publisher" // sends data somewhere (file)
	Action    Kind = "action"    // does something on the host (exec)
)

// Plugin is something a node runs on request. Call is called from many
// goroutines at once (up to the instance's concurrency limit), must honour
// ctx, and must not keep args after it returns. A Call may return a result
// together with an error (a command that exited non-zero still has output):
// the caller gets both.
type Plugin interface {
	Name() string
	Version() string
	Kind() Kind
	// Methods lists what Call accepts.
	Methods() []string
	Call(ctx context.Context, method string, args json.RawMessage) (json.RawMessage, error)
}

// Factory builds a plugin from its load config (`tribe plugin load
// --config k=v`). It must refuse keys it does not know, so a typo is an
// error on every member instead of a silent default.
type Factory func(config map[string]string) (Plugin, error)

// Registry is the plugins a host can load, by name. It is filled before
// the node starts and only read afterwards, so it needs no lock.
type Registry struct {
	factories map[string]Factory
	sources   map[string]string
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{factories: map[string]Factory{}, sources: map[string]string{}}
}

// Register adds a built-in plugin; a second registration under the same
// name is a programming error.
func (r *Registry) Register(name string, f Factory) { r.RegisterFrom(name, SourceBuiltin, f) }

// Where a plugin came from (Registry.Source).
const (
	SourceBuiltin = "builtin" // compiled into the agent
	SourceLocal   = "local"   // an executable in the host's plugin dir
	SourceShared  = "shared"  // sent by a trusted writer: "shared sha256:<hex>"
)

// RegisterFrom adds a plugin that came from source.
func (r *Registry) RegisterFrom(name, source string, f Factory) {
	if _, dup := r.factories[name]; dup {
		panic("plugins: " + name + " registered twice")
	}
	r.factories[name], r.sources[name] = f, source
}

// Source is where plugin name came from ("" if it is not registered).
func (r *Registry) Source(name string) string { return r.sources[name] }

// Names lists the registered plugins, sorted.
func (r *Registry) Names() []string { return slices.Sorted(maps.Keys(r.factories)) }

// Has reports whether name is registered.
func (r *Registry) Has(name string) bool { _, ok := r.factories[name]; return ok }

// ErrUnknownPlugin is returned for a plugin this host does not have.
var ErrUnknownPlugin = errors.New("plugins: unknown plugin")

// Options bound a loaded instance.
type Options struct {
	// Concurrency is how many calls run at once; more wait their turn.
	Concurrency int
	// Queue is how many calls may wait; beyond it a call is refused as
	// busy at once, so a flood cannot pile up goroutines on the host.
	Queue int
}

// DefaultOptions are the limits of an instance unless its load config
// sets them.
func DefaultOptions() Options { return Options{Concurrency: 8, Queue: 64} }

// Load builds an instance of plugin name for tribe. The config keys
// `concurrency` and `queue` set the instance's Options (every plugin has
// them); the rest go to the plugin's Factory.
func (r *Registry) Load(name, tribe string, config map[string]string) (*Instance, error) {
	f, ok := r.factories[name]
	if !ok {
		return nil, fmt.Errorf("%w %q on this host (it has %s)", ErrUnknownPlugin, name, strings.Join(r.Names(), ", "))
	}
	return LoadWith(f, name, tribe, config)
}

// LoadWith builds an instance of plugin name for tribe with f, a plugin
// the registry does not hold (one shared by a trusted writer), as Load
// does.
func LoadWith(f Factory, name, tribe string, config map[string]string) (*Instance, error) {
	opts := DefaultOptions()
	rest := maps.Clone(config)
	if rest == nil {
		rest = map[string]string{}
	}
	for _, lim := range []struct {
		key string
		dst *int
		min int
	}{{"concurrency", &opts.Concurrency, 1}, {"queue", &opts.Queue, 0}} {
		v, ok := rest[lim.key]
		if !ok {
			continue
		}
		delete(rest, lim.key)
		n, err := strconv.Atoi(v)
		if err != nil || n < lim.min || n > 1<<16 {
			return nil, fmt.Errorf("plugins: load %s: %s=%q: want a whole number from %d to 65536", name, lim.key, v, lim.min)
		}
		*lim.dst = n
	}
	p, err := f(rest)
	if err != nil {
		return nil, fmt.Errorf("plugins: load %s: %w", name, err)
	}
	return &Instance{Plugin: p, Tribe: tribe, Config: maps.Clone(config), opts: opts,
		slots: make(chan struct{}, opts.Concurrency)}, nil
}

// Instance is a plugin loaded for one tribe, with its limits. It is safe
// for concurrent use.
type Instance struct {
	Plugin
	Tribe  string
	Config map[string]string

	opts    Options
	slots   chan struct{}
	waiting atomic.Int64
	calls   atomic.Int64
	refused atomic.Int64
}

// Invoke runs one call within the instance's limits.
func (in *Instance) Invoke(ctx context.Context, method string, args json.RawMessage) (json.RawMessage, error) {
	if !slices.Contains(in.Methods(), method) {
		return nil, &Error{Code: CodeUnknownMethod, Msg: fmt.Sprintf("plugin %s has no method %q (it has %v)", in.Name(), method, in.Methods())}
	}
	select {
	case in.slots <- struct{}{}:
	default:
		if in.waiting.Add(1) > int64(in.opts.Queue) {
			in.waiting.Add(-1)
			in.refused.Add(1)
			return nil, &Error{Code: CodeBusy, Msg: fmt.Sprintf("plugin %s is busy: %d calls running and %d waiting", in.Name(), in.opts.Concurrency, in.opts.Queue)}
		}
		select {
		case in.slots <- struct{}{}:
			in.waiting.Add(-1)
		case <-ctx.Done():
			in.waiting.Add(-1)
			return nil, ctx.Err()
		}
	}
	defer func() { <-in.slots }()
	in.calls.Add(1)
	return in.Call(ctx, method, args)
}

// Stats are an instance's counters.
type Stats struct {
	Calls   int64 `json:"calls"`   // calls that ran
	Refused int64 `json:"refused"` // calls refused as busy
	Running int   `json:"running"`
}

// Stats returns the instance's counters.
func (in *Instance) Stats() Stats {
	return Stats{Calls: in.calls.Load(), Refused: in.refused.Load(), Running: len(in.slots)}
}

// Close releases what the plugin holds, if it holds anything.
func (in *Instance) Close() error {
	if c, ok := in.Plugin.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}
