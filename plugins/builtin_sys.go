package plugins

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/shirou/gopsutil/v4/cpu"
	"github.com/shirou/gopsutil/v4/disk"
	"github.com/shirou/gopsutil/v4/load"
	"github.com/shirou/gopsutil/v4/mem"
	"github.com/shirou/gopsutil/v4/net"
)

// sys collects the host's metrics with gopsutil.
type sys struct {
	version
	paths []string // file systems to report; "/" unless configured
}

func newSys(v version, cfg map[string]string) (*sys, error) {
	if err := configKeys(cfg, "paths"); err != nil {
		return nil, err
	}
	s := &sys{version: v, paths: []string{"/"}}
	if v, ok := cfg["paths"]; ok {
		s.paths = nil
		for _, p := range strings.Split(v, ",") {
			if !filepath.IsAbs(p) {
				return nil, fmt.Errorf("paths=%q: give absolute paths separated by commas", v)
			}
			s.paths = append(s.paths, p)
		}
	}
	return s, nil
}

func (*sys) Name() string      { return "sys" }
func (*sys) Kind() Kind        { return Collector }
func (*sys) Methods() []string { return []string{"collect"} }

// SysMetrics is what `sys collect` answers. Byte counts are bytes.
type SysMetrics struct {
	CPU struct {
		Count   int     `json:"count"`
		Percent float64 `json:"percent"` // busy, over the sampled interval
	} `json:"cpu"`
	Load struct {
		Load1  float64 `json:"load1"`
		Load5  float64 `json:"load5"`
		Load15 float64 `json:"load15"`
	} `json:"load"`
	Memory struct {
		Total       uint64  `json:"total"`
		Available   uint64  `json:"available"`
		Used        uint64  `json:"used"`
		UsedPercent float64 `json:"used_percent"`
		SwapTotal   uint64  `json:"swap_total"`
		SwapFree    uint64  `json:"swap_free"`
	} `json:"memory"`
	Disks   []SysDisk `json:"disks"`
	Network []SysNet  `json:"network"`
	// Errors lists what could not be read; the rest is still there.
	Errors []string `json:"errors,omitempty"`
}

// SysDisk is one file system's usage.
type SysDisk struct {
	Path        string  `json:"path"`
	Fstype      string  `json:"fstype"`
	Total       uint64  `json:"total"`
	Used        uint64  `json:"used"`
	Free        uint64  `json:"free"`
	UsedPercent float64 `json:"used_percent"`
}

// SysNet is one interface's counters since boot.
type SysNet struct {
	Name        string `json:"name"`
	BytesSent   uint64 `json:"bytes_sent"`
	BytesRecv   uint64 `json:"bytes_recv"`
	PacketsSent uint64 `json:"packets_sent"`
	PacketsRecv uint64 `json:"packets_recv"`
	Errors      uint64 `json:"errors"`
	Drops       uint64 `json:"drops"`
}

// maxSample caps the CPU sampling interval a caller may ask for.
const maxSample = 10 * time.Second

func (s *sys) Call(ctx context.Context, _ string, args json.RawMessage) (json.RawMessage, error) {
	var a struct {
		// SampleMS samples CPU use over this many milliseconds; 0 reports
		// the use since the previous collect (since boot for the first).
		SampleMS int64 `json:"sample_ms"`
	}
	if err := decodeArgs(args, &a); err != nil {
		return nil, err
	}
	if a.SampleMS < 0 || time.Duration(a.SampleMS)*time.Millisecond > maxSample {
		return nil, Errorf(CodeBadRequest, "sample_ms %d: from 0 to %d", a.SampleMS, maxSample.Milliseconds())
	}
	var m SysMetrics
	var errs []error
	note := func(what string, err error) {
		if err != nil {
			m.Errors = append(m.Errors, what+": "+err.Error())
			errs = append(errs, err)
		}
	}
	n, err := cpu.CountsWithContext(ctx, true)
	note("cpu count", err)
	m.CPU.Count = n
	pct, err := cpu.PercentWithContext(ctx, time.Duration(a.SampleMS)*time.Millisecond, false)
	note("cpu percent", err)
	if len(pct) > 0 {
		m.CPU.Percent = pct[0]
	}
	if l, err := load.AvgWithContext(ctx); err == nil {
		m.Load.Load1, m.Load.Load5, m.Load.Load15 = l.Load1, l.Load5, l.Load15
	} else {
		note("load", err)
	}
	if v, err := mem.VirtualMemoryWithContext(ctx); err == nil {
		m.Memory.Total, m.Memory.Available, m.Memory.Used, m.Memory.UsedPercent = v.Total, v.Available, v.Used, v.UsedPercent
		m.Memory.SwapTotal, m.Memory.SwapFree = v.SwapTotal, v.SwapFree
	} else {
		note("memory", err)
	}
	m.Disks = []SysDisk{}
	for _, p := range s.paths {
		u, err := disk.UsageWithContext(ctx, p)
		if err != nil {
			note("disk "+p, err)
			continue
		}
		m.Disks = append(m.Disks, SysDisk{Path: u.Path, Fstype: u.Fstype, Total: u.Total, Used: u.Used, Free: u.Free, UsedPercent: u.UsedPercent})
	}
	m.Network = []SysNet{}
	ifs, err := net.IOCountersWithContext(ctx, true)
	note("network", err)
	for _, i := range ifs {
		m.Network = append(m.Network, SysNet{Name: i.Name, BytesSent: i.BytesSent, BytesRecv: i.BytesRecv,
			PacketsSent: i.PacketsSent, PacketsRecv: i.PacketsRecv, Errors: i.Errin + i.Errout, Drops: i.Dropin + i.Dropout})
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if len(errs) > 0 && m.Memory.Total == 0 && len(m.Disks) == 0 {
		return b, fmt.Errorf("no metrics could be read: %w", errors.Join(errs...))
	}
	return b, nil
}
