// A typed tool component in JavaScript, built by tests/setup.sh with
// `jco componentize`: the exports below implement wit/tools.wit.

export const text = {
  shout(line) {
    return line.toUpperCase();
  },
  countWords(line) {
    return line.split(/\s+/).filter((w) => w.length > 0).length;
  },
  repeat(word, times) {
    if (times > 10) {
      throw `will not repeat ${times} times (at most 10)`;
    }
    return Array(times).fill(word).join(" ");
  },
};

export function reverse(xs) {
  // A list<s32> arrives, and must leave, as an Int32Array.
  return Int32Array.from(xs).reverse();
}
