package events

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/tribeagent/tribe/internal/names"
)

// Change is one applied change to the replicated state: Old is the value
// the key held before and New the one it holds now, nil when the key was
// absent or deleted (a present empty value is a non-nil empty slice).
type Change struct {
	Key      string
	Old, New []byte
}

// Names looks up the name a node (by peer ID) answers to; "" when it has
// none. It is called synchronously and must not block.
type Names func(node string) string

// The values read here, with only the fields events need; the node owns
// the full formats (node/tribes.go, node/plugins.go, policy.Policy,
// authority.Admission).
type (
	nodeValue struct {
		Name    string                  `json:"name"`
		Plugins map[string]pluginStatus `json:"plugins"`
	}
	pluginStatus struct {
		Version string `json:"version"`
		Error   string `json:"error"`
	}
	memberValue struct {
		Policies []string `json:"policies"`
	}
	policyValue struct {
		Tribe string `json:"tribe"`
		Expr  string `json:"expr"`
	}
	admissionValue struct {
		State string `json:"state"`
		Name  string `json:"name"`
	}
)

// Translate returns the events that c means, stamped with now: none for a
// key it does not know or a change nobody watches for (a node refreshing
// its facts). A value that does not decode is read as empty, never
// refused: the state's validator has accepted it already.
func Translate(c Change, now time.Time, names Names) []Event {
	segs := strings.Split(c.Key, "/")
	ev := Event{Time: now, Key: c.Key}
	switch {
	case len(segs) == 2 && segs[0] == "nodes":
		return nodeEvents(ev, segs[1], c)
	case len(segs) == 2 && segs[0] == "admitted":
		return admissionEvents(ev, segs[1], c, names)
	case len(segs) == 2 && segs[0] == "policies":
		ev.Name = segs[1]
		var p policyValue
		decode(pick(c.New, c.Old), &p)
		ev.Tribe, ev.Expr = p.Tribe, p.Expr
		return lifecycle(ev, c, PolicyCreated, PolicyUpdated, PolicyDeleted)
	case len(segs) == 2 && segs[0] == "tribes":
		ev.Tribe = segs[1]
		if (c.Old == nil) == (c.New == nil) {
			return nil // rewritten: still there
		}
		return lifecycle(ev, c, TribeCreated, "", TribeDeleted)
	case len(segs) == 5 && segs[0] == "tribes" && segs[2] == "members":
		return memberEvents(ev, segs[1], segs[3], segs[4], c, names)
	case len(segs) == 4 && segs[0] == "tribes" && segs[2] == "plugins":
		ev.Tribe, ev.Plugin = segs[1], segs[3]
		return lifecycle(ev, c, PluginLoaded, PluginUpdated, PluginUnload)
	}
	return nil
}

// lifecycle is the event of a key that was created (no old value),
// updated (both) or deleted (no new value). An empty type means none.
func lifecycle(ev Event, c Change, created, updated, deleted string) []Event {
	switch {
	case c.Old == nil && c.New == nil:
		return nil // a tombstone over nothing
	case c.Old == nil:
		ev.Type = created
	case c.New == nil:
		ev.Type = deleted
	default:
		if updated == "" || string(c.Old) == string(c.New) {
			return nil
		}
		ev.Type = updated
	}
	return []Event{ev}
}

// nodeEvents: a node's first record is its joining; later records matter
// for the per-plugin states they carry.
func nodeEvents(ev Event, id string, c Change) []Event {
	var oldRec, newRec nodeValue
	decode(c.Old, &oldRec)
	decode(c.New, &newRec)
	ev.Node = id
	switch {
	case c.Old == nil && c.New == nil:
		return nil
	case c.Old == nil:
		ev.Type, ev.Name = NodeJoined, newRec.Name
		return append([]Event{ev}, pluginStates(ev, nil, newRec.Plugins)...)
	case c.New == nil:
		ev.Type, ev.Name = NodeRemoved, oldRec.Name
		return []Event{ev}
	}
	ev.Name = newRec.Name
	return pluginStates(ev, oldRec.Plugins, newRec.Plugins)
}

// pluginStates compares what a node said of its plugins ("<tribe>/<plugin>"
// to a version or an error) before and after, sorted by tribe and plugin.
func pluginStates(ev Event, old, cur map[string]pluginStatus) []Event {
	keys := slices.Sorted(maps.Keys(cur))
	for k := range old {
		if _, ok := cur[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out []Event
	for _, k := range keys {
		was, had := old[k]
		now, has := cur[k]
		if had == has && was == now {
			continue
		}
		e := ev
		e.Type = PluginState
		e.Tribe, e.Plugin, _ = strings.Cut(k, "/")
		e.State, e.Version, e.Error = pluginState(now, has), now.Version, names.Cut(now.Error, maxError, "")
		if had {
			e.From = pluginState(was, true)
		}
		out = append(out, e)
	}
	return out
}

// maxError bounds the error an event carries: a node's record may hold
// one of nearly 64 KiB, and a watcher's buffer holds 1,024 events.
const maxError = 1 << 10

func pluginState(s pluginStatus, present bool) string {
	switch {
	case !present:
		return "unloaded"
	case s.Error != "":
		return "error"
	}
	return "loaded"
}

func admissionEvents(ev Event, id string, c Change, names Names) []Event {
	var oldA, newA admissionValue
	decode(c.Old, &oldA)
	decode(c.New, &newA)
	if c.Old == nil && c.New == nil || oldA == newA && (c.Old == nil) == (c.New == nil) {
		return nil
	}
	ev.Type, ev.Node = Admission, id
	ev.State, ev.From = newA.State, oldA.State
	if c.New == nil {
		ev.State = "none"
	}
	if ev.Name = newA.Name; ev.Name == "" {
		if ev.Name = oldA.Name; ev.Name == "" && names != nil {
			ev.Name = names(id)
		}
	}
	return []Event{ev}
}

// memberEvents: Via is "manual" for a manual membership and the matching
// policies for a policy one, as `tribe members` shows them.
func memberEvents(ev Event, tribe, id, kind string, c Change, names Names) []Event {
	via := func(v []byte) []string {
		if kind != "policy" {
			return []string{kind}
		}
		var m memberValue
		decode(v, &m)
		return m.Policies
	}
	ev.Tribe, ev.Node = tribe, id
	if names != nil {
		ev.Name = names(id)
	}
	ev.Via = via(pick(c.New, c.Old))
	if c.Old != nil && c.New != nil && slices.Equal(via(c.Old), ev.Via) {
		return nil
	}
	return lifecycle(ev, c, MemberAdded, MemberChanged, MemberRemoved)
}

func pick(a, b []byte) []byte {
	if a != nil {
		return a
	}
	return b
}

func decode(b []byte, v any) {
	if len(b) > 0 {
		json.Unmarshal(b, v)
	}
}
