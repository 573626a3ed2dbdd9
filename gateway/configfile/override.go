package configfile

import (
	"strings"

	"go.yaml.in/yaml/v3"
)

// override sets o.Key in root, the file's top mapping, as if the file held o.Value
// there. The nodes it makes are recorded in p.synthetic, so that their errors name
// o.Source.
func (p *parser) override(root *yaml.Node, o Override) {
	segs := strings.Split(o.Key, ".")
	for _, s := range segs {
		if !upstreamName(s) {
			p.errorf(pos{source: o.Source}, "", "%q is not a key of the file (such as defaults.ttl)", o.Key)
			return
		}
	}
	cur := root
	for i, seg := range segs {
		last := i == len(segs)-1
		k, v := lookup(cur, seg)
		if last {
			val := p.value(seg, o)
			if k == nil {
				cur.Content = append(cur.Content, p.node(yaml.ScalarNode, seg, o.Source), val)
			} else {
				setValue(cur, k, val)
			}
			return
		}
		switch {
		case k == nil:
			m := p.node(yaml.MappingNode, "", o.Source)
			cur.Content = append(cur.Content, p.node(yaml.ScalarNode, seg, o.Source), m)
			cur = m
		case v.Kind == yaml.MappingNode && (!exclusive(seg) || p.isSynthetic(v)):
			cur = v
		case v.Kind == yaml.SequenceNode || v.Kind == yaml.AliasNode:
			p.errorf(pos{source: o.Source}, "", "cannot set %s: %s is %s in the file", o.Key, strings.Join(segs[:i+1], "."), describe(v))
			return
		default:
			// A scalar, nothing, or one of the file's key: and scope: mappings, which
			// hold one source each: the override replaces it.
			m := p.node(yaml.MappingNode, "", o.Source)
			setValue(cur, k, m)
			cur = m
		}
	}
}

// exclusive reports whether the mapping under key holds exactly one of its members,
// so that setting one replaces the others.
func exclusive(key string) bool { return key == "key" || key == "scope" }

// lookup returns the first key named name in the mapping m and its value, or nils.
func lookup(m *yaml.Node, name string) (k, v *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if c := m.Content[i]; c.Kind == yaml.ScalarNode && c.Value == name {
			return c, m.Content[i+1]
		}
	}
	return nil, nil
}

// setValue replaces the value of key k in the mapping m.
func setValue(m, k, v *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i] == k {
			m.Content[i+1] = v
			return
		}
	}
}

// value is the node of an override's value: a list for the keys that hold one,
// comma-separated, else a string.
func (p *parser) value(key string, o Override) *yaml.Node {
	if key != "methods" && key != "ignore" {
		return p.node(yaml.ScalarNode, o.Value, o.Source)
	}
	seq := p.node(yaml.SequenceNode, "", o.Source)
	for item := range strings.SplitSeq(o.Value, ",") {
		if item = strings.TrimSpace(item); item != "" {
			seq.Content = append(seq.Content, p.node(yaml.ScalarNode, item, o.Source))
		}
	}
	return seq
}

func (p *parser) node(kind yaml.Kind, value, source string) *yaml.Node {
	n := &yaml.Node{Kind: kind, Value: value}
	if kind == yaml.ScalarNode {
		n.Tag = "!!str"
	}
	p.synthetic[n] = source
	return n
}

func (p *parser) isSynthetic(n *yaml.Node) bool {
	_, ok := p.synthetic[n]
	return ok
}
