package dynamo

import (
	"context"
	"errors"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/agentloop/agentloop/lib/agent"
)

const (
	attrNS  = "ns"
	attrKey = "key"
)

// PutValue overwrites the value with one PutItem (chunks first when large), then deletes the chunks of the value
// it replaced (returned as ALL_OLD).
func (s *Store) PutValue(ctx context.Context, ns, k string, value []byte) error {
	pk := valuesPK(ns)
	chunkSK := valChunkSK(k)
	p, err := s.pack(value, false, pk, chunkSK, nil)
	if err != nil {
		return err
	}
	if err := s.writeChunks(ctx, p); err != nil {
		return err
	}
	it := key(pk, valSK(k))
	it[attrKind] = avS("kv")
	it[attrNS] = avS(ns)
	it[attrKey] = avS(k)
	for a, v := range p.attrs {
		it[a] = v
	}
	if err := guardSize(it, MaxItemBytes, "value"); err != nil {
		return err
	}
	res, err := s.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:    aws.String(s.table),
		Item:         it,
		ReturnValues: types.ReturnValueAllOld,
	})
	if err != nil {
		return storeErr(err, "put value")
	}
	s.dropChunks(ctx, res.Attributes, pk, chunkSK, p.ver)
	return nil
}

func (s *Store) GetValue(ctx context.Context, ns, k string) ([]byte, error) {
	pk := valuesPK(ns)
	for attempt := 0; ; attempt++ {
		head, err := s.getItem(ctx, key(pk, valSK(k)))
		if err != nil {
			return nil, err
		}
		if head == nil {
			return nil, agent.E(agent.KindNotFound, agent.CodeNotFound, "key %q not found in %q", k, ns)
		}
		v, err := s.unpack(ctx, head, pk, valChunkSK(k), nil)
		if errors.Is(err, errTornRead) {
			if attempt < 5 {
				continue
			}
			return nil, tornRead("value " + k)
		}
		return v, err
	}
}

// ListValues is one Query over the namespace partition's V# items, which sort by key.
func (s *Store) ListValues(ctx context.Context, ns string) ([]agent.KV, error) {
	pk := valuesPK(ns)
	var heads []item
	if err := s.queryPrefix(ctx, pk, prefixVal, false, func(it item) error {
		heads = append(heads, it)
		return nil
	}); err != nil {
		return nil, err
	}
	vals, err := s.readAll(ctx, heads, pk,
		func(h item) chunkKeyFunc { return valChunkSK(getS(h, attrKey)) },
		func(ctx context.Context, h item) (item, error) { return s.getItem(ctx, key(pk, getS(h, AttrSK))) })
	if err != nil {
		return nil, err
	}
	out := make([]agent.KV, 0, len(heads))
	for i, h := range heads {
		if h != nil {
			out = append(out, agent.KV{Key: strings.TrimPrefix(getS(h, AttrSK), prefixVal), Value: vals[i]})
		}
	}
	return out, nil
}

func (s *Store) DeleteValue(ctx context.Context, ns, k string) error {
	pk := valuesPK(ns)
	res, err := s.client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName:    aws.String(s.table),
		Key:          key(pk, valSK(k)),
		ReturnValues: types.ReturnValueAllOld,
	})
	if err != nil {
		return storeErr(err, "delete value")
	}
	s.dropChunks(ctx, res.Attributes, pk, valChunkSK(k), "")
	return nil
}
