// Package cfn reads CloudFormation/SAM templates: YAML with the short-form intrinsics (!Ref, !GetAtt, !Sub...)
// rewritten to their long forms, so a template decodes into plain maps and structs. The DynamoDB tests create
// their table from it and the template tests check it.
package cfn

import (
	"strings"

	"gopkg.in/yaml.v3"
)

// Parse decodes template data with every short-form intrinsic expanded.
func Parse(data []byte) (yaml.Node, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return doc, err
	}
	ExpandShortTags(&doc)
	return doc, nil
}

// ExpandShortTags rewrites short-form intrinsics in place: `!Ref X` becomes {Ref: X}, `!GetAtt A.B` becomes
// {Fn::GetAtt: [A, B]}, `!Condition C` becomes {Condition: C}, and any other `!Name v` becomes {Fn::Name: v}.
func ExpandShortTags(n *yaml.Node) {
	for _, c := range n.Content {
		ExpandShortTags(c)
	}
	if !strings.HasPrefix(n.Tag, "!") || strings.HasPrefix(n.Tag, "!!") {
		return
	}
	name := strings.TrimPrefix(n.Tag, "!")
	inner := *n
	inner.Tag = ""
	switch name {
	case "Ref", "Condition":
	case "GetAtt":
		name = "Fn::GetAtt"
		if inner.Kind == yaml.ScalarNode {
			res, attr, _ := strings.Cut(inner.Value, ".")
			inner = yaml.Node{Kind: yaml.SequenceNode, Content: []*yaml.Node{
				{Kind: yaml.ScalarNode, Value: res}, {Kind: yaml.ScalarNode, Value: attr},
			}}
		}
	default:
		name = "Fn::" + name
	}
	*n = yaml.Node{Kind: yaml.MappingNode, Line: n.Line, Column: n.Column, Content: []*yaml.Node{
		{Kind: yaml.ScalarNode, Value: name}, &inner,
	}}
}
