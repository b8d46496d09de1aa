// Package policy describes hosts with facts and groups them with policies:
// CEL expressions over the variable `facts` (a map of string to dyn).
//
// Collect gathers the built-in facts (gopsutil and os-release), ParseFact
// and LoadFactsFile add the operator's own. Compile type-checks an
// expression (a syntax error, an unknown function or a non-bool result is
// refused with CEL's message); Program.Eval runs it under a cost limit,
// and a missing fact is "no match", never a crash. Desired is the pure
// function from (facts, policies) to the tribes a host belongs in.
package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/checker"
	celast "github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/interpreter"
)

// CostLimit bounds one evaluation (CEL's abstract cost units): enough for
// any sensible test over a host's facts, too little for a runaway
// comprehension.
const CostLimit = 100000

// MaxExprLen bounds the source of an expression.
const MaxExprLen = 4096

var (
	// ErrCompile wraps CEL's message for an expression that is refused.
	ErrCompile = errors.New("policy: invalid expression")
	// ErrMissingFact is returned when an expression reads a fact the host
	// does not have: the policy does not match there.
	ErrMissingFact = errors.New("policy: missing fact")
)

var (
	envOnce sync.Once
	env     *cel.Env
	envErr  error
)

func celEnv() (*cel.Env, error) {
	envOnce.Do(func() {
		env, envErr = cel.NewEnv(
			cel.Variable("facts", cel.MapType(cel.StringType, cel.DynType)),
			cel.CrossTypeNumericComparisons(true),
			// A literal regex, duration or timestamp that does not parse
			// fails on every node: refuse it when the policy is created.
			cel.ASTValidators(cel.ValidateRegexLiterals(), cel.ValidateDurationLiterals(), cel.ValidateTimestampLiterals()),
		)
	})
	return env, envErr
}

// Program is a compiled, type-checked policy expression. It is safe for
// concurrent use.
type Program struct {
	Expr string
	prg  cel.Program
}

// Compile parses and type-checks expr; the result must be a bool.
func Compile(expr string) (*Program, error) {
	if strings.TrimSpace(expr) == "" {
		return nil, fmt.Errorf("%w: empty expression", ErrCompile)
	}
	if len(expr) > MaxExprLen {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrCompile, len(expr), MaxExprLen)
	}
	if p := cache.get(expr); p != nil {
		return p, nil
	}
	p, err := compile(expr)
	if err != nil {
		return nil, err
	}
	cache.put(p)
	return p, nil
}

func compile(expr string) (*Program, error) {
	e, err := celEnv()
	if err != nil {
		return nil, fmt.Errorf("policy: CEL environment: %w", err)
	}
	ast, iss := e.Compile(expr)
	if iss.Err() != nil {
		return nil, fmt.Errorf("%w: %s", ErrCompile, iss.Err())
	}
	// A dyn result (`facts.storage_tier`) may be a bool at run time; Eval
	// checks it. Anything statically known to be something else is refused.
	// Likewise a comparison of a fact with a literal is refused only when
	// no type of the fact could make it work (`facts.x > [1]`): facts is
	// map(string, dyn) and a fact's type is each node's own (user facts
	// override the built-in ones), so `facts.cpu_count > "a"` matches a node
	// whose cpu_count is text. cel-go (v0.31) has no stricter mode for dyn;
	// refusing more would need a schema of facts that user facts may break.
	if out := ast.OutputType(); !out.IsExactType(types.BoolType) && !out.IsExactType(types.DynType) {
		return nil, fmt.Errorf("%w: the expression is a %s, a policy must be a bool", ErrCompile, ast.OutputType())
	}
	// Where CEL can prove the cost stays under the limit for any facts a
	// node can hold, the limit cannot trip and its run-time tracking is
	// left out: it grows with the square of the elements a comprehension
	// walks (facts.l.exists(x, x.startsWith("10.")) took 4.4 ms at
	// MaxFactItems elements, 0.44 ms without it; see
	// BenchmarkEvalWalkLargestFacts), and any node's facts are walked so.
	// OptOptimize compiles a literal regex once, not at every `matches`
	// (8 µs each, 1024 of them in a walk of a list).
	opts := []cel.ProgramOption{cel.EvalOptions(cel.OptOptimize)}
	if est, err := e.EstimateCost(ast, newFactsSizes(ast)); err != nil || est.Max > CostLimit {
		opts = append(opts, cel.CostLimit(CostLimit))
	}
	prg, err := e.Program(ast, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", ErrCompile, err)
	}
	return &Program{Expr: expr, prg: prg}, nil
}

// cache shares compiled programs by expression text across the process.
// Parsing, type-checking and estimating the cost of an expression take a
// few hundred microseconds; a Program is immutable and a cel.Program safe
// for concurrent use, so every reader of the same text (the nodes of a
// simulation, the node that creates a policy and then evaluates it, a
// repeated `nodes --where`) can share one. Refused expressions are not
// kept.
var cache = programCache{m: map[string]*Program{}}

// maxCached bounds the cache; past it, it starts over.
const maxCached = 1024

type programCache struct {
	mu sync.Mutex
	m  map[string]*Program
}

func (c *programCache) get(expr string) *Program {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[expr]
}

func (c *programCache) put(p *Program) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= maxCached {
		clear(c.m)
	}
	c.m[p.Expr] = p
}

// maxFactsSize bounds the size of any list, map or string among a node's
// facts: they travel in the node's record, whose value is at most
// gossip.MaxValueLen (64 KiB) bytes.
const maxFactsSize = 64 << 10

// factsSizes tells CEL's cost estimator those bounds. A value CEL does
// not know the size of may be a string of maxFactsSize, except where a
// comprehension walks it as it is in the facts: a list or a map there
// holds at most MaxFactItems (DecodeJSON's bound on every node's facts),
// and a string is no range. Without that, the walk of any list in the
// facts counted 64 Ki steps and was always tracked.
type factsSizes struct {
	ranges map[int64]bool // ids of the comprehensions' ranges
}

func newFactsSizes(a *cel.Ast) factsSizes {
	s := factsSizes{ranges: map[int64]bool{}}
	celast.PostOrderVisit(a.NativeRep().Expr(), celast.NewExprVisitor(func(e celast.Expr) {
		if e.Kind() == celast.ComprehensionKind {
			s.ranges[e.AsComprehension().IterRange().ID()] = true
		}
	}))
	return s
}

func (s factsSizes) EstimateSize(n checker.AstNode) *checker.SizeEstimate {
	// The path starts at a variable: facts, or a comprehension's, whose
	// path is its range's (so a variable that shadows facts is not taken
	// for it). A range computed by the expression has none.
	if p := n.Path(); len(p) > 0 && p[0] == "facts" && s.ranges[n.Expr().ID()] {
		return &checker.SizeEstimate{Min: 0, Max: MaxFactItems}
	}
	return &checker.SizeEstimate{Min: 0, Max: maxFactsSize}
}

func (factsSizes) EstimateCallCost(string, string, *checker.AstNode, []checker.AstNode) *checker.CallEstimate {
	return nil
}

// Eval runs the program on facts. A missing fact gives ErrMissingFact; any
// other runtime error (a type mismatch, the cost limit) is returned too.
// Either way the policy does not match.
func (p *Program) Eval(facts Facts) (bool, error) {
	out, _, err := p.prg.Eval(activation{facts})
	if err != nil {
		if strings.Contains(err.Error(), "no such key") {
			return false, fmt.Errorf("%w: %v", ErrMissingFact, err)
		}
		return false, fmt.Errorf("policy: %v", err)
	}
	b, ok := out.Value().(bool)
	if !ok {
		return false, fmt.Errorf("policy: the expression gave %v (%s), not a bool", out.Value(), out.Type().TypeName())
	}
	return b, nil
}

// activation binds the variable `facts`. Unlike a map[string]any it costs
// no allocation per evaluation: the struct is one map pointer wide, so it
// fits in the interface as is.
type activation struct{ facts Facts }

func (a activation) ResolveName(name string) (any, bool) {
	if name == "facts" {
		return map[string]any(a.facts), true
	}
	return nil, false
}

func (activation) Parent() interpreter.Activation { return nil }

// Policy names a tribe that hosts matching Expr belong in.
type Policy struct {
	Name    string `json:"-"`
	Tribe   string `json:"tribe"`
	Expr    string `json:"expr"`
	program *Program
}

// WithProgram compiles p's expression.
func (p Policy) WithProgram() (Policy, error) {
	prg, err := Compile(p.Expr)
	if err != nil {
		return p, err
	}
	p.program = prg
	return p, nil
}

// Outcome is one policy's verdict on one host.
type Outcome struct {
	Policy string
	Tribe  string
	Match  bool
	Err    error // why it could not be evaluated (then Match is false)
}

// Evaluate runs every policy on facts, in policy order. A policy whose
// expression does not compile is reported, not run.
func Evaluate(facts Facts, policies []Policy) []Outcome {
	out := make([]Outcome, 0, len(policies))
	for _, p := range policies {
		o := Outcome{Policy: p.Name, Tribe: p.Tribe}
		prg := p.program
		if prg == nil {
			var err error
			if prg, err = Compile(p.Expr); err != nil {
				o.Err = err
				out = append(out, o)
				continue
			}
		}
		o.Match, o.Err = prg.Eval(facts)
		out = append(out, o)
	}
	return out
}

// Desired maps each tribe a host with facts belongs in by policy to the
// names of the policies that put it there, sorted. Pure.
func Desired(facts Facts, policies []Policy) map[string][]string {
	out := map[string][]string{}
	for _, o := range Evaluate(facts, policies) {
		if o.Match {
			out[o.Tribe] = append(out[o.Tribe], o.Policy)
		}
	}
	for _, names := range out {
		slices.Sort(names)
	}
	return out
}
