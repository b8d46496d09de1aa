package authority

import (
	"errors"
	"slices"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

func newID(t *testing.T) peer.ID {
	t.Helper()
	_, pub, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func lookup(m map[peer.ID]Status) func(peer.ID) (Status, bool) {
	return func(id peer.ID) (Status, bool) { s, ok := m[id]; return s, ok }
}

func TestStatusAndCounts(t *testing.T) {
	w, a, r, p := newID(t), newID(t), newID(t), newID(t)
	list := NewRules(map[peer.ID]bool{w: true}, lookup(map[peer.ID]Status{a: Admitted, r: Revoked, w: Revoked}))
	open := NewRules(nil, lookup(map[peer.ID]Status{r: Revoked}))
	for _, tc := range []struct {
		name   string
		rules  Rules
		id     peer.ID
		status Status
		counts bool
	}{
		{"trusted writer", list, w, Trusted, true}, // a revocation cannot demote the trust list
		{"admitted", list, a, Admitted, true},
		{"revoked", list, r, Revoked, false},
		{"never admitted", list, p, Pending, false},
		{"open trust", open, p, Open, true},
		{"open trust ignores revocations", open, r, Open, true},
	} {
		if got := tc.rules.Status(tc.id); got != tc.status {
			t.Errorf("%s: status %s, want %s", tc.name, got, tc.status)
		}
		if got := tc.rules.Counts(tc.id); got != tc.counts {
			t.Errorf("%s: counts %v, want %v", tc.name, got, tc.counts)
		}
	}
}

func TestDecodeAdmission(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Status
		err  bool
	}{
		{`{"state":"admitted","name":"web-1"}`, Admitted, false},
		{`{"state":"revoked"}`, Revoked, false},
		{`{"state":"trusted"}`, "", true},
		{`{}`, "", true},
		{`not json`, "", true},
	} {
		a, err := DecodeAdmission([]byte(tc.in))
		if (err != nil) != tc.err || a.State != tc.want {
			t.Errorf("%s: %+v, %v", tc.in, a, err)
		}
		if err != nil && !errors.Is(err, ErrBadAdmission) {
			t.Errorf("%s: error %v is not ErrBadAdmission", tc.in, err)
		}
	}
}

func TestBacking(t *testing.T) {
	policies := map[string]PolicyRef{
		"storage": {Tribe: "storage", Expr: "yes"},
		"also":    {Tribe: "storage", Expr: "no"},
		"web":     {Tribe: "web", Expr: "yes"},
	}
	evals := 0
	match := func(expr string) bool { evals++; return expr == "yes" }
	for _, tc := range []struct {
		name    string
		tribe   string
		claimed []string
		want    []string
	}{
		{"a policy that exists, names the tribe and matches", "storage", []string{"storage"}, []string{"storage"}},
		{"no such policy", "core", []string{"no-such-policy"}, nil},
		{"a policy of another tribe", "core", []string{"web"}, nil},
		{"a policy whose expression does not match the facts", "storage", []string{"also"}, nil},
		{"only the backing ones, once", "storage", []string{"also", "storage", "web", "storage"}, []string{"storage"}},
		{"nothing claimed", "storage", nil, nil},
	} {
		if got := Backing(tc.tribe, tc.claimed, policies, match); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	// A claim that repeats one name costs one evaluation, not one per
	// repeat.
	long := make([]string, 15000)
	for i := range long {
		long[i] = "also"
	}
	evals = 0
	if got := Backing("storage", long, policies, match); got != nil || evals != 1 {
		t.Errorf("a long claim: %v after %d evaluations, want none after 1", got, evals)
	}
}

func TestGrant(t *testing.T) {
	w, a, p := newID(t), newID(t), newID(t)
	rules := NewRules(map[peer.ID]bool{w: true}, lookup(map[peer.ID]Status{a: Admitted}))
	memberOf := func(tribes ...string) func(string) bool {
		return func(t string) bool { return slices.Contains(tribes, t) }
	}
	for _, tc := range []struct {
		name   string
		grant  Grant
		caller peer.ID
		member func(string) bool
		want   bool
	}{
		{"trusted writers need no grant", nil, w, memberOf(), true},
		{"no grant: an admitted member may not", nil, a, memberOf("core"), false},
		{"members of the plugin's tribe", Grant{"members"}, a, memberOf("core"), true},
		{"members of another tribe", Grant{"tribe:ops"}, a, memberOf("ops"), true},
		{"not a member of the granted tribe", Grant{"tribe:ops"}, a, memberOf("core"), false},
		{"every admitted node", Grant{"admitted"}, a, memberOf(), true},
		{"a pending node gains nothing from any grant", Grant{"admitted", "members"}, p, memberOf("core"), false},
	} {
		if got := tc.grant.Allows(rules, tc.caller, "core", tc.member); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	open := NewRules(nil, nil)
	if !(Grant{}).Allows(open, p, "core", memberOf()) {
		t.Error("open trust: every caller is trusted")
	}
}

func TestGrantCheck(t *testing.T) {
	for _, g := range []Grant{nil, {"admitted"}, {"members", "tribe:ops", "tribe:a.b-c_1"}} {
		if err := g.Check(); err != nil {
			t.Errorf("%v: %v", g, err)
		}
	}
	for _, g := range []Grant{{"everyone"}, {"tribe:"}, {"tribe:Ops"}, {"members", "tribe:a/b"}} {
		if err := g.Check(); !errors.Is(err, ErrBadGrant) {
			t.Errorf("%v: %v, want ErrBadGrant", g, err)
		}
	}
	if got := (Grant{"members", "tribe:ops", "tribe:core", "admitted"}).Tribes("core"); !slices.Equal(got, []string{"core", "ops"}) {
		t.Errorf("Tribes: %v", got)
	}
}
