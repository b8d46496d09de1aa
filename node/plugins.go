package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/gossip/authority"
	"github.com/tribeagent/tribe/internal/names"
	"github.com/tribeagent/tribe/node/api"
	"github.com/tribeagent/tribe/plugins"
)

// pluginRecord is tribes/<t>/plugins/<p>: load p on every member of t.
type pluginRecord struct {
	Config map[string]string `json:"config,omitempty"`
	// Callers is who besides trusted writers may call it (package
	// authority): "members", "tribe:NAME", "admitted". None: trusted
	// writers only.
	Callers authority.Grant `json:"callers,omitempty"`
	// Binary, for a plugin a trusted writer shared (`plugin add`), is the
	// executable members that take shared plugins fetch and run.
	Binary *sharedBinary `json:"binary,omitempty"`
}

// pluginStatus is what a node says, in its own record, of each plugin it
// was asked to load: the version it runs, or why it could not load it.
type pluginStatus struct {
	Version string `json:"version,omitempty"`
	Error   string `json:"error,omitempty"`
	// Source is where the plugin came from: builtin, local (the plugin
	// dir), shared sha256:<hex> (sent by a trusted writer).
	Source string `json:"source,omitempty"`
}

// ErrUnknownPluginLoad is returned when unloading a plugin not loaded in
// the tribe.
var ErrUnknownPluginLoad = errors.New("plugin not loaded in tribe")

func pluginKey(tribe, name string) string { return tribesPrefix + tribe + "/plugins/" + name }

// loadedPlugin is one (tribe, plugin) this node was asked to run.
type loadedPlugin struct {
	config map[string]string
	inst   *plugins.Instance // nil when loading failed
	err    error
	// unreadable: err is about the entry itself, not this host's plugin
	unreadable bool
	// shared is the binary a trusted writer shared, if it is one, and
	// turn the fetches' count for it when it was loaded (sharing.turn).
	shared *sharedBinary
	turn   int
}

// pluginSet is the node's loaded plugins by "<tribe>/<plugin>".
type pluginSet struct {
	syncMu sync.Mutex // one syncPlugins at a time (it loads outside mu)
	mu     sync.Mutex
	loaded map[string]*loadedPlugin
	// badRetired is what the external plugins unloaded so far wrote
	// that broke their protocol (badLines).
	badRetired atomic.Int64
}

// badLiner is an external plugin, which counts the lines it wrote that
// broke the protocol.
type badLiner interface{ BadLines() int64 }

// badLines counts the lines external plugins wrote that broke their
// protocol, since start (plugin_bad_lines).
func (s *pluginSet) badLines() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.badRetired.Load()
	for _, l := range s.loaded {
		if b, ok := pluginOf(l).(badLiner); ok {
			n += b.BadLines()
		}
	}
	return n
}

// unloadLocked takes plugin k out of the set, keeping the count of its bad
// lines (under mu, as badLines reads it: the count never dips), and
// returns it for the caller to close. Callers hold mu.
func (s *pluginSet) unloadLocked(k string) *loadedPlugin {
	l := s.loaded[k]
	delete(s.loaded, k)
	if b, ok := pluginOf(l).(badLiner); ok {
		s.badRetired.Add(b.BadLines())
	}
	return l
}

// pluginOf is the plugin l runs, if it loaded.
func pluginOf(l *loadedPlugin) plugins.Plugin {
	if l.inst == nil {
		return nil
	}
	return l.inst.Plugin
}

// status is the plugins part of the node's record; source says where a
// plugin came from. A loaded plugin that can tell its health (an external
// one that keeps crashing) is an error while it is unwell.
func (s *pluginSet) status(source func(name string) string) map[string]pluginStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.loaded) == 0 {
		return nil
	}
	out := map[string]pluginStatus{}
	for k, l := range s.loaded {
		_, name, _ := strings.Cut(k, "/")
		st := pluginStatus{Source: source(name)}
		if l.shared != nil {
			st.Source = l.shared.source()
		}
		if l.err != nil {
			st.Error = cutError(l.err.Error())
		} else {
			st.Version = l.inst.Version()
			if h, ok := l.inst.Plugin.(interface{ Health() error }); ok {
				if err := h.Health(); err != nil {
					st.Error = cutError(err.Error())
				}
			}
		}
		out[k] = st
	}
	return out
}

// maxPluginErrorLen caps a plugin's error in the node's record and its
// log. Some of it is text others chose: a plugin's refusal of its
// handshake (up to an answer's 4 MiB), each peer's refusal of a shared
// plugin's fetch (up to 1 KiB, one per member asked). Whole, one such
// error made the record too large to write (over gossip.MaxValueLen): no
// more facts, plugin states or leaving said by this node; and put as much
// in the log at each load.
const maxPluginErrorLen = 1024

// cutError is s cut to maxPluginErrorLen bytes, saying so.
func cutError(s string) string { return names.Cut(s, maxPluginErrorLen, " [...]") }

func (s *pluginSet) get(tribe, name string) (*loadedPlugin, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.loaded[tribe+"/"+name]
	return l, ok
}

// byName returns the tribes in which name is loaded or failed, sorted.
func (s *pluginSet) byName(name string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.loaded {
		if t, p, _ := strings.Cut(k, "/"); p == name {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out
}

// closeAll unloads everything (the node is closing).
func (s *pluginSet) closeAll() {
	s.syncMu.Lock() // after a sync under way: what it starts is closed too
	defer s.syncMu.Unlock()
	s.mu.Lock()
	gone := slices.Collect(maps.Values(s.loaded))
	clear(s.loaded)
	s.mu.Unlock()
	for _, l := range gone {
		if l.inst != nil {
			l.inst.Close()
		}
	}
}

// pluginLoop keeps the loaded plugins equal to what the state asks of
// this node: every plugin of every tribe it is a member of.
func (n *Node) pluginLoop() {
	trigger := n.pluginCh
	poke := func(gossip.Change) { n.pokePlugins() }
	// Only plugin entries and this node's own memberships change what it
	// runs; other members' comings and goings do not.
	self := "/members/" + n.host.ID().String() + "/"
	cancel := n.replica.Watch(tribesPrefix, func(c gossip.Change) {
		if strings.Contains(c.Key, "/plugins/") || strings.Contains(c.Key, self) {
			poke(c)
		}
	})
	defer cancel()
	// Whether this node's memberships count changes with its admission,
	// the policies and its own record (the facts a policy is checked on).
	defer n.replica.Watch(authority.AdmittedPrefix+n.host.ID().String(), poke)()
	defer n.replica.Watch(policiesPrefix, poke)()
	defer n.replica.Watch(nodesPrefix+n.host.ID().String(), poke)()
	poke(gossip.Change{})
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-trigger:
		}
		n.reconcilePlugins()
	}
}

// reconcilePlugins loads and unloads what the state asks of this node now
// and, if that changed anything, says so in its record. A job's run calls
// it too, before it looks the plugin up (see callJob).
func (n *Node) reconcilePlugins() {
	if n.syncPlugins() {
		if err := n.publishSelf(n.ctx); err != nil && n.ctx.Err() == nil {
			n.log.Warn("publishing plugin states", "err", err)
		}
	}
}

// pokePlugins makes the plugin loop check what this node should run.
func (n *Node) pokePlugins() {
	select {
	case n.pluginCh <- struct{}{}:
	default:
	}
}

// wantedPlugin is a plugin entry this node should run, or why its entry
// cannot be read (then it is reported as a load error, not skipped).
type wantedPlugin struct {
	config map[string]string
	binary *sharedBinary
	err    error
}

// wantedPlugins reads from the state what this node should run, by
// "<tribe>/<plugin>".
func (n *Node) wantedPlugins() map[string]wantedPlugin {
	member, entries := n.ownTribesAnd("plugins")
	want := map[string]wantedPlugin{}
	for _, e := range entries {
		segs := strings.Split(e.Key, "/")
		if !member[segs[1]] {
			continue
		}
		var rec pluginRecord
		var w wantedPlugin
		if err := json.Unmarshal(e.Value, &rec); err != nil {
			w.err = fmt.Errorf("unreadable plugin entry: %w", err)
		}
		w.config, w.binary = rec.Config, rec.Binary
		want[segs[1]+"/"+segs[3]] = w
	}
	return want
}

// ownTribesAnd returns the tribes where this node's own membership counts
// (admitted, and backed by a policy or a trusted writer: the only tribes
// whose plugins and tasks it runs), and the entries tribes/<t>/<kind>/<x>
// of every tribe, in one pass over the state.
func (n *Node) ownTribesAnd(kind string) (member map[string]bool, entries []*gossip.Signed) {
	self := n.host.ID()
	rules := n.rules()
	member = map[string]bool{}
	for _, e := range n.replica.Prefix(tribesPrefix) {
		segs := strings.Split(e.Key, "/")
		switch {
		case len(segs) == 5 && segs[2] == "members" && segs[3] == self.String():
			if len(n.memberVia(rules, segs[1], self, segs[4], e)) > 0 {
				member[segs[1]] = true
			}
		case len(segs) == 4 && segs[2] == kind:
			entries = append(entries, e)
		}
	}
	return member, entries
}

// syncPlugins loads, reloads and unloads to match wantedPlugins, and
// reports whether anything changed.
func (n *Node) syncPlugins() bool {
	s := &n.plugins
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	want := n.wantedPlugins()
	var gone []*loadedPlugin
	var add []string
	s.mu.Lock()
	for k, l := range s.loaded {
		if w, ok := want[k]; ok && maps.Equal(w.config, l.config) && (w.err != nil) == l.unreadable &&
			sameBinary(w.binary, l.shared) && !(l.shared != nil && l.err != nil && n.sharing.turn(l.shared.SHA256) != l.turn) {
			continue // the same entry gives the same outcome (a shared plugin's: until a fetch of it ends)
		}
		gone = append(gone, s.unloadLocked(k))
		n.log.Info("plugin unloaded", "plugin", k)
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if _, ok := s.loaded[k]; !ok {
			add = append(add, k)
		}
	}
	s.mu.Unlock()
	// Stopping and starting take time (an external plugin's shutdown
	// grace, its handshake, a shared binary's hash): outside the lock that
	// every call's authorisation takes, so calls to the other plugins go
	// on meanwhile.
	for _, l := range gone {
		if l.inst != nil {
			l.inst.Close()
		}
	}
	loaded := map[string]*loadedPlugin{}
	for _, k := range add {
		tribe, name, _ := strings.Cut(k, "/")
		w := want[k]
		l := &loadedPlugin{config: w.config, err: w.err, unreadable: w.err != nil, shared: w.binary}
		switch {
		case l.err != nil:
		case w.binary != nil:
			l.turn = n.sharing.turn(w.binary.SHA256) // before a fetch it may start
			l.inst, l.err = n.loadShared(name, tribe, l.config, w.binary)
		default:
			l.inst, l.err = n.registry.Load(name, tribe, l.config)
		}
		loaded[k] = l
		if l.err != nil {
			n.log.Warn("plugin failed to load", "plugin", k, "err", cutError(l.err.Error()))
		} else {
			n.log.Info("plugin loaded", "plugin", k, "version", l.inst.Version())
		}
	}
	s.mu.Lock()
	maps.Copy(s.loaded, loaded)
	s.mu.Unlock()
	return len(gone) > 0 || len(add) > 0
}

func sameBinary(a, b *sharedBinary) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

// isMember reports whether id is a member of tribe that counts, by hand
// or by a policy that backs it.
func (n *Node) isMember(tribe string, id peer.ID) bool {
	return n.isMemberUnder(n.rules(), tribe, id)
}

func (n *Node) isMemberUnder(rules authority.Rules, tribe string, id peer.ID) bool {
	for _, via := range []string{"manual", "policy"} {
		if e, ok := n.replica.Get(memberKey(tribe, id, via)); ok && len(n.memberVia(rules, tribe, id, via, e)) > 0 {
			return true
		}
	}
	return false
}

// Authorize implements plugins.Authorizer: the plugin must be loaded here
// in a tribe this node is a member of, and the plugin's entry must grant
// the caller (trusted writers always; members of named tribes or every
// admitted node only if the entry says so). A call without a tribe may use
// any tribe in which this node has the plugin.
func (n *Node) Authorize(caller peer.ID, req plugins.Request) (*plugins.Instance, error) {
	tribes := []string{req.Tribe}
	if req.Tribe == "" {
		tribes = n.plugins.byName(req.Plugin)
	}
	rules := n.rules()
	member := func(t string) bool { return n.isMemberUnder(rules, t, caller) }
	var found *loadedPlugin
	for _, t := range tribes {
		l, ok := n.plugins.get(t, req.Plugin)
		// Loaded is not enough: this node's own membership must count now
		// (the plugin loop unloads after a revocation, but not in the
		// same instant).
		if !ok || !n.isMemberUnder(rules, t, n.host.ID()) {
			continue
		}
		if l.err == nil && n.callers(t, req.Plugin).Allows(rules, caller, t, member) {
			return l.inst, nil
		}
		if found == nil || found.err == nil {
			found = l // a load error explains more than a refusal
		}
	}
	switch {
	case found != nil && found.err != nil:
		return nil, plugins.Errorf(plugins.CodeNotLoaded, "plugin %s failed to load on this node: %v", req.Plugin, found.err)
	case found != nil && !rules.Counts(caller):
		return nil, plugins.Errorf(plugins.CodeUnauthorized, "%s is %s: no trusted writer has admitted it (tribe admit)", caller, rules.Status(caller))
	case found != nil:
		return nil, plugins.Errorf(plugins.CodeUnauthorized, "%s is not a trusted writer and no grant on %s lets it call (tribe plugin load %s --tribe T --callers members|tribe:NAME|admitted)", caller, req.Plugin, req.Plugin)
	case req.Tribe == "":
		return nil, plugins.Errorf(plugins.CodeNotLoaded, "plugin %s is not loaded on this node in any tribe", req.Plugin)
	case !n.isMemberUnder(rules, req.Tribe, n.host.ID()):
		return nil, plugins.Errorf(plugins.CodeNotLoaded, "this node is not a member of tribe %q", req.Tribe)
	}
	return nil, plugins.Errorf(plugins.CodeNotLoaded, "plugin %s is not loaded on this node in tribe %s", req.Plugin, req.Tribe)
}

// callers is the grant on a plugin's entry in tribe (none if unreadable).
func (n *Node) callers(tribe, name string) authority.Grant {
	e, ok := n.replica.Get(pluginKey(tribe, name))
	if !ok {
		return nil
	}
	var rec pluginRecord
	if json.Unmarshal(e.Value, &rec) != nil || rec.Callers.Check() != nil {
		return nil
	}
	return rec.Callers
}

// LoadPlugin implements api.Agent. The config is tried on this node
// first, so a typo is refused here instead of failing on every member.
func (n *Node) LoadPlugin(ctx context.Context, name, tribe string, req api.LoadRequest) (api.Plugin, error) {
	config := req.Config
	grant := authority.Grant(req.Callers)
	if err := grant.Check(); err != nil {
		return api.Plugin{}, api.BadRequest(err)
	}
	if err := checkTribeName(tribe); err != nil {
		return api.Plugin{}, err
	}
	if !gossip.ValidName(name) {
		return api.Plugin{}, api.BadRequest(fmt.Errorf("plugin name %q: use lower-case letters, digits, '.', '_' or '-'", name))
	}
	// Whether this node may write it at all comes first: the answer does
	// not depend on how much of the state it has seen yet.
	if err := n.replica.Trust().Authorize(pluginKey(tribe, name), n.host.ID()); err != nil {
		return api.Plugin{}, writeErr(err)
	}
	if _, ok := n.tribes()[tribe]; !ok {
		return api.Plugin{}, api.NotFound(fmt.Errorf("%w %q (see `tribe list`)", ErrUnknownTribe, tribe))
	}
	// A built-in's config is checked here, as every member will. An
	// external plugin is on the members that installed it, not
	// necessarily here: each member says in `plugin list` whether it
	// has it.
	rec := pluginRecord{Config: config, Callers: grant}
	switch {
	case req.File != "" && n.registry.Source(name) == plugins.SourceBuiltin:
		return api.Plugin{}, api.BadRequest(fmt.Errorf("%s is a built-in plugin's name: name the file otherwise", name))
	case req.File != "":
		b, err := n.addShared(name, req.File)
		if err != nil {
			return api.Plugin{}, err
		}
		rec.Binary = b
	case n.registry.Source(name) == plugins.SourceBuiltin:
		inst, err := n.registry.Load(name, tribe, config)
		if err != nil {
			return api.Plugin{}, api.BadRequest(err)
		}
		inst.Close()
	}
	b, _ := json.Marshal(rec)
	if _, err := n.replica.Put(ctx, pluginKey(tribe, name), b); err != nil {
		return api.Plugin{}, writeErr(err)
	}
	return n.pluginView(tribe, name, rec), nil
}

// UnloadPlugin implements api.Agent.
func (n *Node) UnloadPlugin(ctx context.Context, name, tribe string) (api.Plugin, error) {
	e, ok := n.replica.Get(pluginKey(tribe, name))
	if !ok {
		return api.Plugin{}, api.NotFound(fmt.Errorf("%w: %s is not loaded in %q (see `tribe plugin list`)", ErrUnknownPluginLoad, name, tribe))
	}
	var rec pluginRecord
	json.Unmarshal(e.Value, &rec)
	if _, err := n.replica.Delete(ctx, pluginKey(tribe, name)); err != nil {
		return api.Plugin{}, writeErr(err)
	}
	return api.Plugin{Name: name, Tribe: tribe, Config: orEmptyMap(rec.Config), Callers: orEmpty([]string(rec.Callers)), Nodes: []api.PluginNode{}}, nil
}

// Plugins implements api.Agent: every plugin loaded in a tribe (tribe
// only, if set), with each member's state from its record.
func (n *Node) Plugins(ctx context.Context, tribe string) ([]api.Plugin, error) {
	views := n.tribes()
	if tribe != "" {
		if _, ok := views[tribe]; !ok {
			return nil, api.NotFound(fmt.Errorf("%w %q (see `tribe list`)", ErrUnknownTribe, tribe))
		}
	}
	recs := n.nodeRecords()
	out := []api.Plugin{}
	for _, e := range n.replica.Prefix(tribesPrefix) {
		segs := strings.Split(e.Key, "/")
		if len(segs) != 4 || segs[2] != "plugins" || (tribe != "" && segs[1] != tribe) {
			continue
		}
		var rec pluginRecord
		json.Unmarshal(e.Value, &rec)
		out = append(out, n.pluginEntry(segs[1], segs[3], rec, views[segs[1]], recs))
	}
	return out, nil
}

func (n *Node) pluginView(tribe, name string, rec pluginRecord) api.Plugin {
	return n.pluginEntry(tribe, name, rec, n.tribes()[tribe], n.nodeRecords())
}

func (n *Node) pluginEntry(tribe, name string, rec pluginRecord, v *tribeView, recs map[peer.ID]nodeRecord) api.Plugin {
	p := api.Plugin{Name: name, Tribe: tribe, Config: orEmptyMap(rec.Config), Callers: orEmpty([]string(rec.Callers)), Nodes: []api.PluginNode{}}
	if v == nil {
		return p
	}
	for id := range v.members {
		nrec := recs[id]
		pn := api.PluginNode{ID: id.String(), Name: nrec.Name, State: "pending"}
		if st, ok := nrec.Plugins[tribe+"/"+name]; ok {
			pn.Version, pn.Error, pn.State, pn.Source = st.Version, st.Error, "loaded", st.Source
			if st.Error != "" {
				pn.State = "error"
			}
		}
		p.Nodes = append(p.Nodes, pn)
	}
	slices.SortFunc(p.Nodes, func(a, b api.PluginNode) int { return strings.Compare(a.Name+a.ID, b.Name+b.ID) })
	return p
}

func orEmptyMap(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// callTarget is one node a call goes to, and in which tribe.
type callTarget struct {
	id    peer.ID
	name  string
	tribe string
	addrs []string
}

// callTargets resolves a call's tribes and nodes to distinct targets. It
// reads only the keys it needs: a call is on a hot path, the tribe views
// are not.
func (n *Node) callTargets(req api.CallRequest) ([]callTarget, error) {
	if len(req.Tribes)+len(req.Nodes) == 0 {
		return nil, api.BadRequest(errors.New("name the targets: --tribe T or --node N, at least one"))
	}
	seen := map[peer.ID]bool{}
	var out []callTarget
	add := func(id peer.ID, tribe string) {
		if seen[id] {
			return
		}
		seen[id] = true
		rec, _ := n.nodeNamed(id)
		out = append(out, callTarget{id: id, name: rec.Name, tribe: tribe, addrs: rec.Addrs})
	}
	for _, t := range req.Tribes {
		ids := n.tribeMembers(t)
		if len(ids) == 0 {
			if _, ok := n.tribes()[t]; !ok {
				return nil, api.NotFound(fmt.Errorf("%w %q (see `tribe list`)", ErrUnknownTribe, t))
			}
			return nil, api.BadRequest(fmt.Errorf("tribe %q has no members to call", t))
		}
		for _, id := range ids {
			add(id, t)
		}
	}
	if len(req.Nodes) > 0 {
		ids, err := n.resolve(req.Nodes)
		if err != nil {
			return nil, err
		}
		rules := n.rules()
		for _, id := range ids {
			if !rules.Counts(id) {
				return nil, api.BadRequest(fmt.Errorf("node %s is %s: it can be called once a trusted writer admits it (tribe admit)", id, rules.Status(id)))
			}
		}
		for _, id := range ids {
			add(id, "")
		}
	}
	return out, nil
}

// tribeMembers lists a tribe's members that count (by hand or by a
// policy that backs them), sorted.
func (n *Node) tribeMembers(tribe string) []peer.ID {
	var out []peer.ID
	rules := n.rules()
	for _, e := range n.replica.Prefix(tribesPrefix + tribe + "/members/") {
		_, id, via, ok := splitMemberKey(e.Key)
		if !ok || (len(out) > 0 && out[len(out)-1] == id) {
			continue
		}
		// A reaped member (gone past --reconnect-timeout, or force-left)
		// is out of every view, fan-outs included.
		if len(n.memberVia(rules, tribe, id, via, e)) > 0 && !n.reaped(id) {
			out = append(out, id)
		}
	}
	return out
}

// Call implements api.Agent: it calls every target at once (at most
// CallParallel in flight), this node itself included through the same
// authorisation, and hands each answer to emit as it comes. Past
// CallRelayFrom targets it holds no connection to, those go through the
// connected ones (relay.go).
func (n *Node) Call(ctx context.Context, req api.CallRequest, emit func(api.CallResult)) (api.CallSummary, error) {
	if err := (plugins.Request{Plugin: req.Plugin, Method: req.Method}).Check(); err != nil {
		return api.CallSummary{}, api.BadRequest(err)
	}
	if len(req.Args) > 0 && !json.Valid(req.Args) {
		return api.CallSummary{}, api.BadRequest(errors.New("the arguments are not valid JSON"))
	}
	if req.Timeout < 0 || req.Timeout > plugins.MaxTimeout {
		return api.CallSummary{}, api.BadRequest(fmt.Errorf("timeout %v: from 1ms to %v", req.Timeout, plugins.MaxTimeout))
	}
	targets, err := n.callTargets(req)
	if err != nil {
		return api.CallSummary{}, err
	}
	timeout := req.Timeout
	if timeout == 0 {
		timeout = plugins.DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := n.now()
	sum := api.CallSummary{Targets: len(targets)}
	n.rngMu.Lock()
	n.rng.Shuffle(len(targets), func(i, j int) { targets[i], targets[j] = targets[j], targets[i] })
	n.rngMu.Unlock()
	direct, far, relays := relayPlan(targets, n.host.ID(), n.isConnected, n.cfg.CallRelayFrom)
	var emu sync.Mutex // record runs for the direct calls and each relay's
	record := func(t callTarget, r plugins.Response) {
		emu.Lock()
		defer emu.Unlock()
		res := api.CallResult{ID: t.id.String(), Name: t.name, Tribe: t.tribe, OK: r.OK, Result: r.Result,
			Error: r.Error, Code: string(r.Code), MS: msSince(n.now(), start)}
		n.observeCall(r, n.now().Sub(start))
		switch {
		case r.OK:
			sum.Answered++
		case r.Code == plugins.CodeTimeout:
			sum.TimedOut++
		default:
			sum.Failed++
		}
		emit(res)
	}
	var relayed sync.WaitGroup
	if len(far) > 0 {
		// Through relays, the connected targets get the same order
		// directly; only this node is called.
		var near []callTarget
		direct = slices.DeleteFunc(direct, func(t callTarget) bool {
			if t.id == n.host.ID() {
				return false
			}
			near = append(near, t)
			return true
		})
		relayed.Go(func() {
			n.callThrough(ctx, near, far, relays, plugins.Request{ID: n.callID(), Plugin: req.Plugin, Method: req.Method, Args: req.Args}, record)
		})
	}
	again := plugins.FanOut(ctx, direct, n.cfg.CallParallel, func(ctx context.Context, t callTarget) plugins.Response {
		return n.callOne(ctx, t, plugins.Request{ID: n.callID(), Tribe: t.tribe, Plugin: req.Plugin, Method: req.Method, Args: req.Args})
	}, record)
	relayed.Wait()
	n.callDialRetries.Add(int64(again))
	sum.MS = msSince(n.now(), start)
	return sum, nil
}

// callOne calls one target: this node directly, any other over a stream.
func (n *Node) callOne(ctx context.Context, t callTarget, req plugins.Request) plugins.Response {
	if t.id == n.host.ID() {
		if dl, ok := ctx.Deadline(); ok {
			req.Deadline = max(1, dl.Sub(n.now()).Milliseconds())
		}
		return n.calls.Serve(ctx, n.host.ID(), req)
	}
	if !n.isConnected(t.id) {
		n.learnAddrs(t.id, t.addrs)
	}
	defer n.useCallConn(t.id)()
	return n.caller.Call(ctx, t.id, req)
}

// useCallConn registers a call (or a hand-off, a fetch) with p (see
// useConn): a connection it opens is closed after it, once no other
// exchange runs on it and the node has ConnLow peers besides. A fan-out
// to 5,000 hosts then holds at most CallParallel connections of its own at
// a time, instead of one per host until the connection manager's
// one-minute grace period ends (which the outbound connection limit would
// refuse first). A peer protected by another part of the node (a --join
// peer) keeps its connection.
func (n *Node) useCallConn(p peer.ID) (done func()) {
	return n.useConn(p, false, n.cfg.ConnLow, &n.callConnsClosed)
}

// releaseConn closes the node's connections to p unless it holds no more
// than keep peers (p included) or p is protected, and reports whether it
// closed them.
func (n *Node) releaseConn(p peer.ID, keep int) bool {
	if len(n.host.Network().Peers()) <= keep || n.host.ConnManager().IsProtected(p, "") {
		return false
	}
	n.caller.Drop(p)
	n.host.Network().ClosePeer(p)
	return true
}

func (n *Node) callID() string {
	n.rngMu.Lock()
	defer n.rngMu.Unlock()
	return fmt.Sprintf("%016x", n.rng.Uint64())
}

// learnRecordAddrs makes a node this one holds no connection to, and
// whose addresses the peerstore lacks, dialable from its record: for a
// stream to a node met only through the state (a probe, a job's
// hand-off, a fetch). Only for nodes that count: a stranger's record
// could name any address.
func (n *Node) learnRecordAddrs(p peer.ID) {
	if n.isConnected(p) || len(n.host.Peerstore().Addrs(p)) > 0 || !n.rules().Counts(p) {
		return
	}
	if rec, ok := n.nodeNamed(p); ok {
		n.learnAddrs(p, rec.Addrs[:min(len(rec.Addrs), maxRecordAddrs)])
	}
}

// learnAddrs adds a node's recorded addresses to the peerstore, so a call
// can dial a node this one is not connected to.
func (n *Node) learnAddrs(id peer.ID, addrs []string) {
	n.host.Peerstore().AddAddrs(id, recordAddrs(id, addrs), peerstore.TempAddrTTL)
}

// recordAddrs are the transport addresses of id among a node record's full
// /p2p/ addresses; those of another peer, or malformed, are left out.
func recordAddrs(id peer.ID, addrs []string) []ma.Multiaddr {
	var as []ma.Multiaddr
	for _, s := range addrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			continue
		}
		if ai, err := peer.AddrInfoFromP2pAddr(a); err == nil && ai.ID == id {
			as = append(as, ai.Addrs...)
		}
	}
	return as
}

func msSince(now, start time.Time) float64 {
	return float64(now.Sub(start).Microseconds()) / 1000
}
