// nsqjs driven from the command line by tests/interop, the same interface as gnsq_client.py.
//
// read: an nsqjs Reader (through nsqlookupd or straight to nsqd) prints one JSON line a
// delivery to stdout, {"body", "attempts", "action"}, and answers it: "fin", "req" (REQ 0
// without backoff, for a body named by --requeue on its first attempt) or "hold" (neither FIN
// nor REQ: after --finish-first bodies starting with --hold-prefix were finished, the further
// ones are held until SIGUSR2, then everything is finished). It exits 0 once --count distinct
// bodies are finished, 1 at --timeout.
//
// publish: an nsqjs Writer sends each body with PUB, or all of them in one MPUB with --mpub,
// and prints {"published": n} once nsqd answered OK.
'use strict'

const nsq = require('nsqjs')

function parse(argv) {
  const [command, ...rest] = argv
  const lists = new Set(['lookupd', 'nsqd', 'requeue'])
  const flags = new Set(['mpub'])
  const args = {command, lookupd: [], nsqd: [], requeue: [], bodies: []}
  for (let i = 0; i < rest.length; i++) {
    if (!rest[i].startsWith('--')) {
      args.bodies.push(rest[i])
      continue
    }
    const key = rest[i].slice(2).replace(/-(.)/g, (_, c) => c.toUpperCase())
    if (flags.has(key)) {
      args[key] = true
    } else if (lists.has(key)) {
      args[key].push(rest[++i])
    } else {
      args[key] = rest[++i]
    }
  }
  return args
}

function emit(fields) {
  process.stdout.write(JSON.stringify(fields) + '\n')
}

function finishWith(code, fields) {
  emit(fields)
  process.exitCode = code
  // Node leaves once the closed sockets have sent what was queued on them (the last FIN,
  // then CLS); should anything else keep it alive, it leaves anyway after a moment.
  setTimeout(() => process.exit(code), 3000).unref()
}

function read(args) {
  const count = Number(args.count)
  const finishFirst = Number(args.finishFirst || 0)
  const holdPrefix = args.holdPrefix || ''
  const finished = new Set()
  let prefixFinished = 0
  let released = holdPrefix === ''
  let closing = false
  process.on('SIGUSR2', () => {
    released = true
  })

  const reader = new nsq.Reader(args.topic, args.channel, {
    lookupdHTTPAddresses: args.lookupd,
    nsqdTCPAddresses: args.nsqd,
    maxInFlight: Number(args.maxInFlight || 6),
    lookupdPollInterval: Number(args.lookupdPollInterval || 1), // seconds, nsqjs's minimum
    lookupdPollJitter: 0.1,
  })

  function action(body, attempts) {
    if (attempts === 1 && args.requeue.includes(body)) return 'req'
    if (!released && body.startsWith(holdPrefix)) {
      if (prefixFinished >= finishFirst) return 'hold'
      prefixFinished++
    }
    return 'fin'
  }

  reader.on(nsq.Reader.MESSAGE, (message) => {
    const body = message.body.toString('latin1')
    const what = action(body, message.attempts)
    emit({body, attempts: message.attempts, action: what})
    if (what === 'fin') {
      message.finish()
      finished.add(body)
      if (finished.size >= count && !closing) {
        closing = true
        // nsqjs writes a FIN on the next tick: close the Reader only after that
        setImmediate(() => reader.close())
        finishWith(0, {done: true, finished: finished.size})
      }
    } else if (what === 'req') {
      message.requeue(0, false)
    }
    // 'hold': no answer at all
  })
  reader.on(nsq.Reader.ERROR, (err) => {
    process.stderr.write(`nsqjs reader error: ${err && err.stack ? err.stack : err}\n`)
  })
  reader.on(nsq.Reader.NSQD_CONNECTED, (host, port) => {
    process.stderr.write(`nsqjs reader connected to ${host}:${port}\n`)
  })
  reader.on(nsq.Reader.NSQD_CLOSED, (host, port) => {
    process.stderr.write(`nsqjs reader lost ${host}:${port}\n`)
  })
  setTimeout(() => {
    if (closing) return
    closing = true
    reader.close()
    finishWith(1, {done: false, finished: finished.size})
  }, Number(args.timeout || 30) * 1000).unref()
  reader.connect()
}

function publish(args) {
  const [host, port] = args.nsqd[0].split(':')
  const writer = new nsq.Writer(host, Number(port))
  const timer = setTimeout(() => {
    finishWith(1, {published: 0, error: 'timeout'})
  }, Number(args.timeout || 10) * 1000)
  writer.on(nsq.Writer.ERROR, (err) => {
    clearTimeout(timer)
    finishWith(1, {published: 0, error: String(err)})
  })
  writer.on(nsq.Writer.READY, async () => {
    const send = (what) =>
      new Promise((resolve, reject) =>
        writer.publish(args.topic, what, (err) => (err ? reject(err) : resolve()))
      )
    try {
      if (args.mpub) {
        await send(args.bodies) // an array: one MPUB
      } else {
        for (const body of args.bodies) await send(body)
      }
    } catch (err) {
      clearTimeout(timer)
      finishWith(1, {published: 0, error: String(err)})
      return
    }
    clearTimeout(timer)
    writer.close()
    finishWith(0, {published: args.bodies.length})
  })
  writer.connect()
}

const args = parse(process.argv.slice(2))
if (args.command === 'read') {
  read(args)
} else if (args.command === 'publish') {
  publish(args)
} else {
  process.stderr.write('usage: nsqjs_client.js read|publish --topic T ...\n')
  process.exit(2)
}
