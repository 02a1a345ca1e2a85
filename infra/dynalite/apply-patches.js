// Applies patches/*.patch (unified diffs against node_modules, paths a/<package>/... and b/<package>/...) to the
// installed packages, in name order: npm runs it after every `npm ci` here (postinstall), and dynamotest runs it
// when node_modules/.agentloop-patches does not name the current patches (an install made before a patch changed).
// Plain Node, no `patch` program: each hunk's old text must occur exactly once in its file (then it is replaced by
// the new text) or its new text must already be there (applied before); anything else fails the install, so a
// bumped package whose code moved cannot run unpatched. Files are replaced by rename, so a server starting
// meanwhile reads either version whole. The marker is written last: sha256 over each patch's name and text.
'use strict'
const fs = require('fs')
const path = require('path')
const crypto = require('crypto')

const here = __dirname
const modules = path.join(here, 'node_modules')
const dir = path.join(here, 'patches')
const names = fs.readdirSync(dir).filter((n) => n.endsWith('.patch')).sort()
const hash = crypto.createHash('sha256')

for (const name of names) {
  const text = fs.readFileSync(path.join(dir, name), 'utf8')
  hash.update(name + '\n' + text)
  for (const file of parse(text, name)) {
    const target = path.join(modules, file.path)
    let src = fs.readFileSync(target, 'utf8')
    let changed = false
    for (const [i, h] of file.hunks.entries()) {
      const where = `${name}: ${file.path} hunk ${i + 1}`
      const n = count(src, h.old)
      if (n === 1) {
        src = src.replace(h.old, () => h.new)
        changed = true
      } else if (count(src, h.new) !== 1) {
        throw new Error(`${where}: its old text occurs ${n} times (want 1) and its new text is not there`)
      }
    }
    if (changed) {
      const tmp = target + '.agentloop-' + process.pid
      fs.writeFileSync(tmp, src)
      fs.renameSync(tmp, target)
      console.log(`applied ${name} to ${file.path}`)
    }
  }
}
const marker = path.join(modules, '.agentloop-patches')
fs.writeFileSync(marker + '.' + process.pid, hash.digest('hex') + '\n')
fs.renameSync(marker + '.' + process.pid, marker)

function count (s, sub) {
  let n = 0
  for (let i = s.indexOf(sub); i >= 0; i = s.indexOf(sub, i + 1)) n++
  return n
}

// parse reads a unified diff into files, each with hunks of old and new text (whole lines, newline-terminated).
function parse (text, name) {
  const files = []
  let file = null, hunk = null
  for (const line of text.replace(/\n$/, '').split('\n')) {
    if (line.startsWith('--- ')) continue
    if (line.startsWith('+++ ')) {
      const p = line.slice(4).split('\t')[0]
      file = { path: p.replace(/^b\//, ''), hunks: [] }
      files.push(file)
      hunk = null
    } else if (line.startsWith('@@')) {
      if (!file) throw new Error(`${name}: a hunk before any +++ line`)
      hunk = { old: '', new: '' }
      file.hunks.push(hunk)
    } else if (hunk && line.startsWith(' ')) {
      hunk.old += line.slice(1) + '\n'
      hunk.new += line.slice(1) + '\n'
    } else if (hunk && line.startsWith('-')) {
      hunk.old += line.slice(1) + '\n'
    } else if (hunk && line.startsWith('+')) {
      hunk.new += line.slice(1) + '\n'
    } else if (hunk && line === '') {
      // diff -u writes an empty context line as " "; an editor may have trimmed it to ""
      hunk.old += '\n'
      hunk.new += '\n'
    }
  }
  if (!files.length) throw new Error(`${name}: no file in the patch`)
  return files
}
