package events

import (
	"reflect"
	"testing"
	"time"
)

func TestTranslate(t *testing.T) {
	now := time.Unix(1700000000, 0)
	names := func(id string) string { return map[string]string{"P2": "n2"}[id] }
	b := func(s string) []byte { return []byte(s) }
	tests := []struct {
		name     string
		c        Change
		want     []Event
		wantNone bool
	}{
		{name: "node joins with its first record",
			c:    Change{Key: "nodes/P2", New: b(`{"name":"n2","addrs":["/ip4/1.2.3.4"]}`)},
			want: []Event{{Type: NodeJoined, Key: "nodes/P2", Node: "P2", Name: "n2"}}},
		{name: "node record rewritten with the same plugins", wantNone: true,
			c: Change{Key: "nodes/P2", Old: b(`{"name":"n2","facts":{"a":1}}`), New: b(`{"name":"n2","facts":{"a":2}}`)}},
		{name: "node record deleted",
			c:    Change{Key: "nodes/P2", Old: b(`{"name":"n2"}`)},
			want: []Event{{Type: NodeRemoved, Key: "nodes/P2", Node: "P2", Name: "n2"}}},
		{name: "per-member plugin states, sorted",
			c: Change{Key: "nodes/P2",
				Old: b(`{"name":"n2","plugins":{"core/echo":{"version":"1"},"core/sys":{"version":"1"},"web/exec":{"version":"1"}}}`),
				New: b(`{"name":"n2","plugins":{"core/echo":{"version":"1"},"core/sys":{"error":"no such plugin"},"edge/file":{"version":"2"}}}`)},
			want: []Event{
				{Type: PluginState, Key: "nodes/P2", Node: "P2", Name: "n2", Tribe: "core", Plugin: "sys", State: "error", From: "loaded", Error: "no such plugin"},
				{Type: PluginState, Key: "nodes/P2", Node: "P2", Name: "n2", Tribe: "edge", Plugin: "file", State: "loaded", Version: "2"},
				{Type: PluginState, Key: "nodes/P2", Node: "P2", Name: "n2", Tribe: "web", Plugin: "exec", State: "unloaded", From: "loaded"},
			}},
		{name: "tribe created", c: Change{Key: "tribes/core", New: b(`{"created_by":"P1"}`)},
			want: []Event{{Type: TribeCreated, Key: "tribes/core", Tribe: "core"}}},
		{name: "tribe rewritten", wantNone: true, c: Change{Key: "tribes/core", Old: b(`{}`), New: b(`{"created_by":"P1"}`)}},
		{name: "tribe deleted", c: Change{Key: "tribes/core", Old: b(`{}`)},
			want: []Event{{Type: TribeDeleted, Key: "tribes/core", Tribe: "core"}}},
		{name: "tombstone over nothing", wantNone: true, c: Change{Key: "tribes/core"}},
		{name: "manual member added", c: Change{Key: "tribes/core/members/P2/manual", New: b(`{}`)},
			want: []Event{{Type: MemberAdded, Key: "tribes/core/members/P2/manual", Tribe: "core", Node: "P2", Name: "n2", Via: []string{"manual"}}}},
		{name: "policy member removed", c: Change{Key: "tribes/core/members/P3/policy", Old: b(`{"policies":["linux"]}`)},
			want: []Event{{Type: MemberRemoved, Key: "tribes/core/members/P3/policy", Tribe: "core", Node: "P3", Via: []string{"linux"}}}},
		{name: "policy member now by other policies",
			c:    Change{Key: "tribes/core/members/P2/policy", Old: b(`{"policies":["a"]}`), New: b(`{"policies":["a","b"]}`)},
			want: []Event{{Type: MemberChanged, Key: "tribes/core/members/P2/policy", Tribe: "core", Node: "P2", Name: "n2", Via: []string{"a", "b"}}}},
		{name: "policy member rewritten alike", wantNone: true,
			c: Change{Key: "tribes/core/members/P2/policy", Old: b(`{"policies":["a"]}`), New: b(`{"policies":["a"]}`)}},
		{name: "policy created", c: Change{Key: "policies/linux", New: b(`{"tribe":"core","expr":"true"}`)},
			want: []Event{{Type: PolicyCreated, Key: "policies/linux", Name: "linux", Tribe: "core", Expr: "true"}}},
		{name: "policy replaced", c: Change{Key: "policies/linux", Old: b(`{"tribe":"core","expr":"true"}`), New: b(`{"tribe":"core","expr":"false"}`)},
			want: []Event{{Type: PolicyUpdated, Key: "policies/linux", Name: "linux", Tribe: "core", Expr: "false"}}},
		{name: "policy deleted", c: Change{Key: "policies/linux", Old: b(`{"tribe":"core","expr":"true"}`)},
			want: []Event{{Type: PolicyDeleted, Key: "policies/linux", Name: "linux", Tribe: "core", Expr: "true"}}},
		{name: "plugin loaded", c: Change{Key: "tribes/core/plugins/echo", New: b(`{}`)},
			want: []Event{{Type: PluginLoaded, Key: "tribes/core/plugins/echo", Tribe: "core", Plugin: "echo"}}},
		{name: "plugin unloaded", c: Change{Key: "tribes/core/plugins/echo", Old: b(`{}`)},
			want: []Event{{Type: PluginUnload, Key: "tribes/core/plugins/echo", Tribe: "core", Plugin: "echo"}}},
		{name: "admitted", c: Change{Key: "admitted/P2", New: b(`{"state":"admitted","name":"n2"}`)},
			want: []Event{{Type: Admission, Key: "admitted/P2", Node: "P2", Name: "n2", State: "admitted"}}},
		{name: "revoked", c: Change{Key: "admitted/P2", Old: b(`{"state":"admitted","name":"n2"}`), New: b(`{"state":"revoked"}`)},
			want: []Event{{Type: Admission, Key: "admitted/P2", Node: "P2", Name: "n2", State: "revoked", From: "admitted"}}},
		{name: "admission deleted", c: Change{Key: "admitted/P9", Old: b(`{"state":"revoked"}`)},
			want: []Event{{Type: Admission, Key: "admitted/P9", Node: "P9", State: "none", From: "revoked"}}},
		{name: "unknown key kind", wantNone: true, c: Change{Key: "tribes/core/tasks/t1", New: b(`{}`)}},
		{name: "undecodable value is read as empty",
			c:    Change{Key: "nodes/P2", New: b(`not json`)},
			want: []Event{{Type: NodeJoined, Key: "nodes/P2", Node: "P2"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Translate(tt.c, now, names)
			if tt.wantNone {
				if len(got) != 0 {
					t.Fatalf("got %+v, want no events", got)
				}
				return
			}
			for i := range tt.want {
				tt.want[i].Time = now
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestLivenessTransitions(t *testing.T) {
	l := NewLiveness()
	t0 := time.Unix(1700000000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	s := func(id, state string) Sample { return Sample{Node: id, Name: "name-" + id, State: state} }

	if got := l.Observe([]Sample{s("a", "alive"), s("b", "dead")}, at(0)); len(got) != 0 {
		t.Fatalf("the baseline reported %+v", got)
	}
	if got := l.Observe([]Sample{s("a", "alive"), s("b", "dead")}, at(1)); len(got) != 0 {
		t.Fatalf("no change reported %+v", got)
	}
	got := l.Observe([]Sample{s("c", "alive"), s("a", "suspect"), s("b", "alive")}, at(2))
	want := []Event{
		{Time: at(2), Type: "node-suspect", Key: "nodes/a", Node: "a", Name: "name-a", State: "suspect", From: "alive"},
		{Time: at(2), Type: "node-alive", Key: "nodes/b", Node: "b", Name: "name-b", State: "alive", From: "dead"},
		{Time: at(2), Type: "node-alive", Key: "nodes/c", Node: "c", Name: "name-c", State: "alive"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
	// A liveness value this package never heard of is passed on as is.
	got = l.Observe([]Sample{s("a", "left"), s("b", "alive")}, at(3))
	if len(got) != 1 || got[0].Type != "node-left" || got[0].From != "suspect" {
		t.Fatalf("got %+v, want a node-left from suspect", got)
	}
	// c was forgotten (its record went); coming back, it is new again.
	got = l.Observe([]Sample{s("a", "left"), s("b", "alive"), s("c", "dead")}, at(4))
	if len(got) != 1 || got[0].Node != "c" || got[0].From != "" {
		t.Fatalf("got %+v, want c as a new node", got)
	}
	// A change noted between samples is reported once: by Note, not
	// again by the sample that finds it.
	if e, ok := l.Note(s("a", "suspect"), at(5)); !ok || e.Type != "node-suspect" || e.From != "left" {
		t.Fatalf("noted %+v %v, want a node-suspect from left", e, ok)
	}
	if e, ok := l.Note(s("a", "dead"), at(5)); !ok || e.From != "suspect" {
		t.Fatalf("noted %+v %v, want a node-dead from suspect", e, ok)
	}
	if _, ok := l.Note(s("a", "dead"), at(5)); ok {
		t.Fatal("the same state noted twice was reported twice")
	}
	if got := l.Observe([]Sample{s("a", "dead"), s("b", "alive"), s("c", "dead")}, at(6)); len(got) != 0 {
		t.Fatalf("a noted change was reported again: %+v", got)
	}
	// After Reset the next sample is a baseline again, and nothing is
	// noted before it.
	l.Reset()
	if _, ok := l.Note(s("a", "suspect"), at(7)); ok {
		t.Fatal("a change was noted with no baseline")
	}
	if got := l.Observe([]Sample{s("a", "alive")}, at(5)); len(got) != 0 {
		t.Fatalf("the baseline after Reset reported %+v", got)
	}
}
