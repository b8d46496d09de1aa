package node

import (
	"testing"
	"time"

	"github.com/tribeagent/tribe/gossip"
)

func TestLeaveAndReapRules(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const timeout, reconnect = 30 * time.Second, time.Hour
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	hlc := func(d time.Duration) gossip.HLC { return gossip.MakeHLC(ago(d).UnixMilli(), 0) }
	cases := []struct {
		name   string
		v      peerView
		state  string
		reaped bool
	}{
		{"heard just now", peerView{heard: ago(time.Second), record: hlc(2 * time.Hour)}, Alive, false},
		{"connected, never heard", peerView{connected: true, record: hlc(2 * time.Hour)}, Alive, false},
		{"silent a while", peerView{heard: ago(45 * time.Second), record: hlc(2 * time.Hour)}, Suspect, false},
		{"dead, within the reconnect timeout", peerView{heard: ago(59 * time.Minute), record: hlc(2 * time.Hour)}, Dead, false},
		{"dead, past the reconnect timeout", peerView{heard: ago(61 * time.Minute), record: hlc(2 * time.Hour)}, Dead, true},
		{"dead, never heard, record recent", peerView{record: hlc(time.Minute)}, Dead, false},
		{"dead, never heard, record old", peerView{record: hlc(2 * time.Hour)}, Dead, true},
		{"left, lingering connection", peerView{connected: true, heard: ago(time.Second), sent: ago(2 * time.Second), leftAt: ago(time.Second), record: hlc(time.Second)}, Left, false},
		{"left, presence from before it left", peerView{heard: ago(time.Second), sent: ago(time.Second), leftAt: ago(time.Second), record: hlc(time.Second)}, Left, false},
		{"left, then presence after", peerView{heard: ago(time.Second), sent: ago(time.Second), leftAt: ago(time.Minute), record: hlc(time.Minute)}, Alive, false},
		{"left, within the reconnect timeout", peerView{heard: ago(50 * time.Minute), sent: ago(50 * time.Minute), leftAt: ago(50 * time.Minute), record: hlc(50 * time.Minute)}, Left, false},
		{"left, past the reconnect timeout", peerView{heard: ago(2 * time.Hour), sent: ago(2 * time.Hour), leftAt: ago(2 * time.Hour), record: hlc(2 * time.Hour)}, Left, true},
		{"forced out, alive by presence", peerView{connected: true, heard: ago(time.Second), record: hlc(time.Hour), forced: hlc(time.Minute)}, Left, true},
		{"forced out, then a newer record", peerView{heard: ago(time.Second), record: hlc(time.Second), forced: hlc(time.Minute)}, Alive, false},
		{"forced out, newer record, then dead", peerView{record: hlc(time.Second), forced: hlc(time.Minute)}, Dead, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.v.state(now, timeout); got != tc.state {
				t.Errorf("state = %s, want %s", got, tc.state)
			}
			if got := tc.v.reaped(now, timeout, reconnect); got != tc.reaped {
				t.Errorf("reaped = %v, want %v", got, tc.reaped)
			}
		})
	}
}
