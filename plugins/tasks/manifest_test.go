package tasks

import (
	"errors"
	"strings"
	"testing"
	"time"
)

const yamlManifest = `
name: psutil-file
schedule:
  interval: 10s
  splay: 2s
  count: 100
workflow:
  collect: {plugin: sys, method: collect}
  process:
    - plugin: echo
      method: echo
      args: {tag: web}
  publish:
    - {plugin: file, method: publish}
    - {plugin: file, method: publish, tribe: sink}
max_failures: 3
`

func TestDecodeYAMLAndJSON(t *testing.T) {
	m, err := Decode([]byte(yamlManifest))
	if err != nil {
		t.Fatal(err)
	}
	if m.Name != "psutil-file" || time.Duration(m.Schedule.Interval) != 10*time.Second || time.Duration(m.Schedule.Splay) != 2*time.Second ||
		m.Schedule.Count != 100 || m.MaxFailures != 3 || len(m.Workflow.Steps()) != 4 || m.Workflow.Publish[1].Tribe != "sink" ||
		string(m.Workflow.Process[0].Args) != `{"tag":"web"}` {
		t.Fatalf("decoded %+v", m)
	}
	j, err := Decode([]byte(`{"name": "c", "schedule": {"cron": "*/5 * * * *"}, "workflow": {"collect": {"plugin": "sys", "method": "collect", "args": [1, 2]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if j.Schedule.Cron != "*/5 * * * *" || string(j.Workflow.Collect.Args) != `[1,2]` {
		t.Fatalf("decoded %+v", j)
	}
}

func TestDecodeRefusesWithTheReason(t *testing.T) {
	good := "name: t\nschedule: {interval: 1s}\nworkflow: {collect: {plugin: sys, method: collect}}\n"
	for _, c := range []struct{ in, want string }{
		{"", "empty"},
		{"name: [", "did not find"},
		{good + "colour: red\n", "colour"},
		{good + "---\nname: u\n", "more than one document"},
		{strings.Replace(good, "name: t", "name: Bad Name", 1), "lower-case"},
		{strings.Replace(good, "{interval: 1s}", "{}", 1), "interval (such as 10s) or a cron"},
		{strings.Replace(good, "{interval: 1s}", "{interval: 1s, cron: '@hourly'}", 1), "not both"},
		{strings.Replace(good, "{interval: 1s}", "{interval: 10ms}", 1), "minimum"},
		{strings.Replace(good, "{interval: 1s}", "{interval: soon}", 1), "use a number and a unit"},
		{strings.Replace(good, "{interval: 1s}", "{cron: '61 * * * *'}", 1), "cron"},
		{strings.Replace(good, "{interval: 1s}", "{interval: 1s, count: -1}", 1), "count"},
		{strings.Replace(good, "{interval: 1s}", "{interval: 1s, start: 2026-11-24T10:00:00Z, stop: 2026-11-24T09:00:00Z}", 1), "not after start"},
		{strings.Replace(good, "{interval: 1s}", "{interval: 10s, start: 0226-01-01T00:00:00Z}", 1), "start 0226-01-01 00:00:00 +0000 UTC is not between 1970 and 2200"},
		{strings.Replace(good, "{interval: 1s}", "{interval: 10s, stop: 9999-01-01T00:00:00Z}", 1), "stop 9999-01-01"},
		{strings.Replace(good, "{plugin: sys, method: collect}", "{plugin: sys}", 1), "collect step 1: name a plugin and a method"},
		{strings.Replace(good, "{plugin: sys, method: collect}", "{plugin: sys, method: collect, tribe: sink}", 1), "only a publish step"},
		{good + "max_failures: -1\n", "max_failures"},
		{good + strings.Repeat("#", MaxManifestSize), "limit"},
	} {
		_, err := Decode([]byte(c.in))
		if !errors.Is(err, ErrBadManifest) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error saying %q", c.in, err, c.want)
		}
	}
}
