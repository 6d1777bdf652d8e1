/**
 * Questions for retrieval and abstention tests: each on-topic one with the file that answers it and
 * a pattern of its key fact; off-topic ones no document answers. Over the bundled corpus, and over a
 * second corpus (networking, Markdown and plain text, with code fences and tables) written by the test.
 */

/** A question a corpus answers: the file that should be cited first and the fact the answer should quote. */
export interface Covered {
  readonly question: string;
  readonly file: string;
  readonly fact: RegExp;
}

export const BUNDLED_COVERED: readonly Covered[] = [
  { question: 'Which policy evicts the oldest buffered element?', file: 'policies.md', fact: /shed-oldest/ },
  { question: 'What happens with the pause policy when a source cannot be paused?', file: 'policies.md', fact: /UnpausableSourceError/ },
  { question: 'What does conflate do with the arriving element?', file: 'policies.md', fact: /merges the arriving element/ },
  { question: 'Which error does the fail policy raise?', file: 'policies.md', fact: /OverflowError/ },
  // "available" frames a question ("what X are available") and names no subject.
  { question: 'What policies are available?', file: 'policies.md', fact: /shed-incoming|shed-oldest|conflate/ },
  {
    question: 'How does a stage keep a fast source from flooding a slow model?',
    file: 'backpressure.md',
    fact: /only while it has room|Demand flows upstream/,
  },
  { question: 'Why is mergeMap in plain RxJS slow over a million elements?', file: 'backpressure.md', fact: /quadratic|43 seconds/ },
  { question: 'How many elements can sit between source and sink with capacities 16 and 32?', file: 'backpressure.md', fact: /57 elements/ },
  { question: 'When is a micro-batch emitted?', file: 'batching.md', fact: /when full or `maxWait`/ },
  { question: 'What does a batch do when downstream has no demand?', file: 'batching.md', fact: /waits and keeps filling/ },
  { question: 'How are batched results split back into one element per item?', file: 'batching.md', fact: /unbatch/ },
  { question: 'Why is per-stage timing sampled?', file: 'traces.md', fact: /40 nanoseconds/ },
  { question: 'Are trace ids compatible with W3C traceparent?', file: 'traces.md', fact: /W3C traceparent compatible/ },
  { question: 'What does a sampled element record for each stage?', file: 'traces.md', fact: /queue wait, service time and paused time/ },
  { question: 'What does the embedding cache skip for repeated questions?', file: 'retrieval.md', fact: /skips the embedder/ },
  { question: 'How long does a vector search over 100k vectors take?', file: 'retrieval.md', fact: /few milliseconds/ },
  { question: 'Which passages are dropped first when a prompt is over its token budget?', file: 'retrieval.md', fact: /lowest scores are dropped first/ },
];

/** Questions neither corpus answers. */
export const OFF_TOPIC: readonly string[] = [
  'What is the capital city of Australia?',
  'How do I create a React component with hooks?',
  'What is the boiling point of water?',
  'Who wrote Pride and Prejudice?',
  'How do I bake sourdough bread at home?',
  'How do I center a div with CSS flexbox?',
];

/** The second corpus: networking notes, with front matter, rules, fences, tables and a plain text file. */
export const NETWORK_CORPUS: Readonly<Record<string, string>> = {
  'dns.md': [
    '---',
    'title: Name resolution',
    'tags: [dns]',
    '---',
    '',
    '# DNS',
    '',
    'The Domain Name System turns host names into addresses. Resolvers cache every answer for the time to live the record carries.',
    '',
    '## Record types',
    '',
    '| Type | Purpose |',
    '| --- | --- |',
    '| A | maps a name to an IPv4 address |',
    '| AAAA | maps a name to an IPv6 address |',
    '| MX | names the mail exchanger of a domain |',
    '| CNAME | makes a name an alias of another name |',
    '',
    '---',
    '',
    '## Lookups',
    '',
    'Query the mail exchangers of a domain with dig:',
    '',
    '```sh',
    'dig example.com MX +short',
    '```',
  ].join('\n'),
  'tcp.md': [
    '# TCP',
    '',
    '## Handshake',
    '',
    'A connection opens with three packets: SYN from the client, SYN-ACK from the server, then ACK from the client.',
    '',
    '## Closing',
    '',
    'The side that closes first keeps the socket in TIME_WAIT for twice the maximum segment lifetime, usually 60 seconds on Linux.',
    '',
    '## Congestion control',
    '',
    'Slow start doubles the congestion window every round trip until a loss, then congestion avoidance grows it by one segment per round trip.',
  ].join('\n'),
  'tls.md': [
    'Transport Layer Security',
    '========================',
    '',
    'TLS encrypts a TCP stream after a handshake that agrees on keys and checks the server certificate against trusted authorities.',
    '',
    'Server Name Indication',
    '----------------------',
    '',
    'The SNI extension tells the server which host name the client wants, so one address can serve certificates for many sites.',
    '',
    'Inspecting certificates',
    '-----------------------',
    '',
    'Print the certificate chain a server presents:',
    '',
    '```',
    'openssl s_client -connect example.com:443 -showcerts',
    '```',
  ].join('\n'),
  'http.md': [
    '# HTTP',
    '',
    '## Status codes',
    '',
    '| Code | Meaning |',
    '|------|---------|',
    '| 200 | the request succeeded |',
    '| 301 | the resource moved permanently |',
    '| 404 | nothing exists at that path |',
    '| 429 | too many requests: the client is rate limited |',
    '| 503 | the service is unavailable for now |',
    '',
    '## Multiplexing',
    '',
    'HTTP/2 multiplexes many requests as independent streams over a single connection, so a slow response no longer blocks the ones behind it.',
  ].join('\n'),
  'firewall.txt': [
    'Firewall rules are read top to bottom and the first match decides what happens to a packet.',
    '',
    'To block incoming telnet on port 23 with iptables, append a drop rule to the input chain:',
    '',
    'iptables -A INPUT -p tcp --dport 23 -j DROP',
    '',
    'A default policy of drop with explicit accept rules is safer than the reverse.',
  ].join('\n'),
};

export const NETWORK_COVERED: readonly Covered[] = [
  { question: 'Which DNS record type maps a name to an IPv6 address?', file: 'dns.md', fact: /AAAA/ },
  { question: 'Which command queries the mail exchangers of a domain?', file: 'dns.md', fact: /dig example\.com MX/ },
  { question: 'How long do resolvers cache an answer?', file: 'dns.md', fact: /time to live/ },
  { question: 'Which three packets open a TCP connection?', file: 'tcp.md', fact: /SYN-ACK/ },
  { question: 'How long does a socket stay in TIME_WAIT?', file: 'tcp.md', fact: /60 seconds|twice the maximum segment lifetime/ },
  { question: 'How does slow start grow the congestion window?', file: 'tcp.md', fact: /doubles the congestion window/ },
  { question: 'How do I print the certificate chain a server presents?', file: 'tls.md', fact: /openssl s_client/ },
  { question: 'What does the SNI extension tell the server?', file: 'tls.md', fact: /which host name the client wants/ },
  { question: 'What does status code 429 mean?', file: 'http.md', fact: /rate limited/ },
  { question: 'How does HTTP/2 send many requests over one connection?', file: 'http.md', fact: /multiplexes many requests/ },
  { question: 'How do I block incoming telnet on port 23 with iptables?', file: 'firewall.txt', fact: /iptables -A INPUT -p tcp --dport 23 -j DROP/ },
  { question: 'In which order are firewall rules read?', file: 'firewall.txt', fact: /top to bottom/ },
];

/** Questions about the bundled corpus: off-topic for the networking one. */
export const NETWORK_OFF_TOPIC: readonly string[] = [
  ...OFF_TOPIC,
  'Which policy evicts the oldest buffered element?',
  'Why is per-stage timing sampled?',
  // In the corpus's own words, about a system it never names.
  'How do I block incoming telnet on port 23 on OpenBSD?',
];
