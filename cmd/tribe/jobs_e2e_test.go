package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tribeagent/tribe/gossip"
	"github.com/tribeagent/tribe/node/api"
)

// webAgent is a member of tribe web by policy whose exec table appends a
// line to a file in its data dir: mark at once, slow and then sleeps 3s.
func webAgent(t *testing.T, name string, extra ...string) *agentProc {
	t.Helper()
	dir := shortTempDir(t)
	cfg := filepath.Join(dir, "agent.yaml")
	conf := fmt.Sprintf(`exec:
  commands:
    mark: {argv: [sh, -c, "echo x >> %[1]s/marks; echo marked"]}
    slow: {argv: [sh, -c, "echo x >> %[1]s/slow; sleep 3; echo slept"]}
`, dir)
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	a := newAgent(t, name, append([]string{"--config", cfg, "--fact", "role=web"}, extra...)...)
	a.files = dir
	return a
}

// fileLines counts the lines of a file in a web agent's files dir.
func fileLines(a *agentProc, name string) int {
	b, _ := os.ReadFile(filepath.Join(a.files, name))
	return strings.Count(string(b), "\n")
}

func jobStatus(a *agentProc, id string) (api.Job, map[string]api.JobTarget) {
	var j api.Job
	a.cliJSON(&j, "job", "status", id)
	rows := map[string]api.JobTarget{}
	for _, t := range j.Targets {
		rows[t.Name] = t
	}
	return j, rows
}

func submitJob(t *testing.T, a *agentProc, args ...string) string {
	t.Helper()
	out, stderr, code := tribe(append([]string{"job", "submit", "--json", "--data-dir", a.dir}, args...)...)
	if code != 0 {
		t.Fatalf("job submit %v: exit %d: %s%s", args, code, out, stderr)
	}
	var j struct{ ID string }
	if err := json.Unmarshal([]byte(out), &j); err != nil || j.ID == "" {
		t.Fatalf("job submit printed %q: %v", out, err)
	}
	return j.ID
}

// A job reaches a member that was down when it was submitted, once it
// comes back; a member killed while it runs the job reports it interrupted
// (and runs it again only with --retries); a job that expires before a
// member returns is expired there and never runs; a member that lost its
// state runs none of the jobs it ran again. o1 is the fleet's trusted
// writer (acks travel to it alone).
func TestJobReachesEveryMemberAcrossKills(t *testing.T) {
	o1 := newAgent(t, "o1")
	o1ID := presetIdentity(t, o1)
	o1.args = append(o1.args, "--trusted", o1ID, "--auto-admit", "true")
	o1.start()
	seed := o1.tcpJoin()
	member := func(name string) *agentProc { return webAgent(t, name, "--join", seed, "--trusted", o1ID) }
	web := []*agentProc{member("w1"), member("w2"), member("w3")}
	for _, w := range web {
		w.start()
	}
	w3 := web[2]
	run := o1.run
	run(0, "policy", "create", "web", "--tribe", "web", `facts.role == "web"`)
	waitUntil(t, 60*time.Second, "tribe web of 3", func() bool {
		var tr api.Tribe
		o1.cliJSON(&tr, "show", "web")
		return len(tr.Members) == 3
	})
	run(0, "plugin", "load", "exec", "--tribe", "web")
	waitUntil(t, 30*time.Second, "exec loaded on all 3", func() bool {
		var ps []api.Plugin
		o1.cliJSON(&ps, "plugin", "list", "--tribe", "web")
		n := 0
		for _, p := range ps {
			for _, m := range p.Nodes {
				if m.State == "loaded" {
					n++
				}
			}
		}
		return n == 3
	})

	// 1. w3 is down when the job is submitted.
	w3.kill()
	id := submitJob(t, o1, "--tribe", "web", "exec", "run", `{"command":"mark"}`)
	waitUntil(t, 30*time.Second, "2 done and 1 pending", func() bool {
		j, rows := jobStatus(o1, id)
		return j.State == "pending" && j.Counts["done"] == 2 && rows["w3"].State == "pending"
	})
	w3.start()
	waitUntil(t, 30*time.Second, "the job done on all 3 after w3's restart", func() bool {
		j, _ := jobStatus(o1, id)
		return j.State == "done"
	})
	for _, w := range web {
		if n := fileLines(w, "marks"); n != 1 {
			t.Errorf("%s ran the job %d times", w.name, n)
		}
	}
	if out := run(0, "job", "wait", id, "--timeout", "10s"); !strings.Contains(out, "done") {
		t.Errorf("job wait of a done job: %q", out)
	}
	if out := run(0, "job", "output", id, "w3"); !strings.Contains(out, "marked") {
		t.Errorf("job output from w3: %q", out)
	}

	// 2. w3 is killed while it runs the job: interrupted, never run again.
	id = submitJob(t, o1, "--tribe", "web", "exec", "run", `{"command":"slow"}`)
	waitUntil(t, 30*time.Second, "w3 running the slow job", func() bool { return fileLines(w3, "slow") == 1 })
	w3.kill()
	w3.start()
	waitUntil(t, 30*time.Second, "the job to end on all 3", func() bool {
		j, _ := jobStatus(o1, id)
		return j.State != "pending"
	})
	j, rows := jobStatus(o1, id)
	if j.State != "failed" || rows["w3"].State != "interrupted" || rows["w1"].State != "done" || rows["w3"].Attempts != 1 {
		t.Fatalf("after w3 was killed mid-run: %+v", j)
	}
	if out := run(1, "job", "wait", id); !strings.Contains(out, "did not end done") {
		t.Errorf("job wait of a failed job: %q", out)
	}
	// Past the first retry's backoff (1 s): a retry would have started
	// by now, and it writes its line as it starts.
	time.Sleep(1500 * time.Millisecond)
	if n := fileLines(w3, "slow"); n != 1 {
		t.Errorf("w3 ran the interrupted job again without --retries: %d runs", n)
	}

	// 3. With --retries, the interrupted run is made again.
	id = submitJob(t, o1, "--tribe", "web", "--retries", "1", "exec", "run", `{"command":"slow"}`)
	waitUntil(t, 30*time.Second, "w3 running the slow job again", func() bool { return fileLines(w3, "slow") == 2 })
	w3.kill()
	w3.start()
	out := run(0, "job", "wait", id, "--timeout", "60s")
	if _, rows := jobStatus(o1, id); rows["w3"].State != "done" || rows["w3"].Attempts != 2 || fileLines(w3, "slow") != 3 {
		t.Fatalf("a retried interrupted job: %+v, %d runs\n%s", rows["w3"], fileLines(w3, "slow"), out)
	}

	// 4. A job that expires before w3 returns is expired there, never run.
	w3.kill()
	id = submitJob(t, o1, "--tribe", "web", "--expires", "2s", "exec", "run", `{"command":"mark"}`)
	waitUntil(t, 30*time.Second, "done on w1 and w2", func() bool {
		j, _ := jobStatus(o1, id)
		return j.Counts["done"] == 2
	})
	j, _ = jobStatus(o1, id)
	time.Sleep(time.Until(j.Expires) + 100*time.Millisecond) // w3 comes back after the job expired
	w3.start()
	waitUntil(t, 30*time.Second, "w3 to ack the expired job", func() bool {
		var own api.Job
		out, _, code := tribe("job", "status", "--json", "--data-dir", w3.dir, id)
		if code != 0 || json.Unmarshal([]byte(out), &own) != nil {
			return false // w3 has not got the job yet
		}
		for _, tg := range own.Targets {
			if tg.Name == "w3" {
				return tg.State == "expired"
			}
		}
		return false
	})
	if n := fileLines(w3, "marks"); n != 1 {
		t.Errorf("w3 ran an expired job: %d marks", n)
	}
	if j, _ := jobStatus(o1, id); j.State != "failed" {
		t.Errorf("a job expired on one target: %s", j.State)
	}
	if out := run(0, "job", "list", "--tribe", "web"); strings.Count(out, "\n") != 5 {
		t.Errorf("job list of 4 jobs:\n%s", out)
	}

	// 5. w3 loses its state and keeps its identity: it gets the jobs back
	// and asks the writer for its acks; it runs none of them again.
	w3.kill()
	if err := os.Remove(filepath.Join(w3.dir, gossip.StoreFile)); err != nil {
		t.Fatal(err)
	}
	w3.start()
	waitUntil(t, 30*time.Second, "w3 to hold the jobs again", func() bool {
		// A status pulls the jobs from the writer (w3 then holds all
		// four), and that job's acks: asked of the last job, the one
		// that expired, it brings w3 none of the acks of the three it
		// ran.
		var own api.Job
		out, _, code := tribe("job", "status", "--json", "--data-dir", w3.dir, id)
		if code != 0 || json.Unmarshal([]byte(out), &own) != nil {
			return false
		}
		for _, tg := range own.Targets {
			if tg.Name == "w3" {
				return tg.State == "expired"
			}
		}
		return false
	})
	time.Sleep(1500 * time.Millisecond) // a run would have started (and marked) by now
	if m, s := fileLines(w3, "marks"), fileLines(w3, "slow"); m != 1 || s != 3 {
		t.Errorf("w3 ran jobs again after losing its state: %d marks (want 1), %d slow runs (want 3)", m, s)
	}

	// 6. The writer goes down: the others' acks go to it alone, so a
	// member waiting on the job learns of no more ends, and says why.
	w1 := web[0]
	id = submitJob(t, o1, "--tribe", "web", "exec", "run", `{"command":"mark"}`)
	waitUntil(t, 30*time.Second, "w1 to run the job", func() bool { return fileLines(w1, "marks") == 3 })
	o1.kill()
	out = w1.run(1, "job", "wait", id, "--timeout", "8s")
	if !strings.Contains(out, "may know less of the job than its writer") || !strings.Contains(out, "stopped waiting") {
		t.Errorf("job wait on a member, the writer down:\n%s", out)
	}
}
