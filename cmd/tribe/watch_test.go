package main

import (
	"strings"
	"testing"
	"time"

	"github.com/tribeagent/tribe/node/api/events"
)

func TestPrintEvent(t *testing.T) {
	var b strings.Builder
	at := time.Date(2025, 3, 1, 12, 0, 0, 5e6, time.Local)
	printEvent(&b, events.Event{Time: at, Type: events.MemberAdded, Tribe: "core", Node: "12D3KooX", Name: "n2", Via: []string{"linux", "big"}})
	printEvent(&b, events.Event{Time: at, Type: events.PolicyCreated, Name: "p", Tribe: "core", Expr: `facts.os == "linux"`})
	printEvent(&b, events.Event{Time: at, Type: events.Dropped, Count: 3})
	stamp := at.Format("2006-01-02T15:04:05.000Z07:00")
	want := stamp + " member-added name=n2 tribe=core via=linux,big node=12D3KooX\n" +
		stamp + ` policy-created name=p tribe=core expr="facts.os == \"linux\""` + "\n" +
		stamp + " dropped count=3\n"
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}
