import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import * as z from 'zod';
import { jsonSchemaOf } from '../../src/nats/contract.js';
import { unadmitted } from '../../src/nats/schema-subset.js';

/** Reasons values `producer` sends may be refused by `receiver`, through the JSON Schemas each side records. */
const gaps = (producer: z.ZodType, receiver: z.ZodType) => unadmitted(jsonSchemaOf(receiver, 'receiver'), jsonSchemaOf(producer, 'producer'));

describe('schema subset: what a receiver accepts must cover what a producer sends', () => {
  it('admits the same schema, a wider receiver, and extra optional fields a loose or stripping receiver ignores', () => {
    const request = z.object({ prompt: z.string(), n: z.number().int().min(1) });
    assert.deepEqual(gaps(request, request), []);
    assert.deepEqual(gaps(request, z.object({ prompt: z.string(), n: z.number() })), []);
    assert.deepEqual(gaps(request, z.object({ prompt: z.string() })), []);
    assert.deepEqual(gaps(z.enum(['a', 'b']), z.enum(['a', 'b', 'c'])), []);
    assert.deepEqual(gaps(z.literal('a'), z.string()), []);
    assert.deepEqual(gaps(z.number().int(), z.union([z.string(), z.number()])), []);
    assert.deepEqual(gaps(z.array(z.string()).max(3), z.array(z.string())), []);
    assert.deepEqual(gaps(z.object({ d: z.string().default('x') }), z.object({ d: z.string() })), [], 'a default makes the field always sent');
  });

  it('refuses, naming the field: a field the receiver requires, a type change, a narrowed number, enum or length, a strict receiver', () => {
    const cases: [z.ZodType, z.ZodType, RegExp][] = [
      [z.object({ prompt: z.string() }), z.object({ prompt: z.string(), n: z.number() }), /^n: the receiver requires it/],
      [z.object({ n: z.number() }), z.object({ n: z.string() }), /^n: the producer may send number, the receiver admits string/],
      [z.object({ n: z.number() }), z.object({ n: z.number().int() }), /^n: the producer may send number, the receiver admits integer/],
      [z.enum(['a', 'b', 'c']), z.enum(['a', 'b']), /the receiver refuses "c"/],
      [z.string(), z.string().min(1), /minLength 1, the producer sets none/],
      [z.object({ s: z.string().max(10) }), z.object({ s: z.string().max(5) }), /^s: the receiver needs maxLength 5, the producer allows 10/],
      [z.object({ a: z.string(), extra: z.number() }), z.object({ a: z.string() }).strict(), /^extra: the receiver admits nothing/],
      [z.union([z.string(), z.number()]), z.string(), /the producer may send number/],
      [z.object({ tags: z.array(z.number()) }), z.object({ tags: z.array(z.string()) }), /^tags\[\]: the producer may send number/],
      [z.string(), z.string().regex(/^a/), /pattern/],
    ];
    for (const [producer, receiver, reason] of cases) {
      const found = gaps(producer, receiver);
      assert.ok(
        found.some((text) => reason.test(text)),
        `${reason}: ${JSON.stringify(found)}`,
      );
    }
  });
});
