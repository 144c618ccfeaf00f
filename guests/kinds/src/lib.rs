//! A typed tool component: no `wasi:cli/run`, only exported functions, which
//! the host turns into tools. Every WIT type kind crosses its boundary, one
//! interface function takes a resource (the host leaves it out), `count`
//! keeps state (visible only when the host keeps one instance a session),
//! `trap`, `spin` and `hog` each break one limit of the host, and `prefix`
//! has a planted bug for `moat fuzz` to find.

// `scalars` takes one parameter of every scalar kind, on purpose: the
// bindings and the implementation both have ten.
#![allow(clippy::too_many_arguments)]

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};

wit_bindgen::generate!({ path: "wit", world: "kinds" });

use exports::moat::kinds::shapes::{self, Colour, Perms, Point, Shape};

struct Kinds;

static CALLS: AtomicU32 = AtomicU32::new(0);

impl Guest for Kinds {
    fn greet(name: String) -> String {
        format!("Hello, {name}!")
    }

    fn add(a: u8, b: u8) -> u16 {
        u16::from(a) + u16::from(b)
    }

    fn scalars(
        b: bool,
        small: i8,
        short: i16,
        int: i32,
        long: i64,
        word: u32,
        big: u64,
        single: f32,
        double: f64,
        letter: char,
    ) -> (bool, i8, i16, i32, i64, u32, u64, f32, f64, char) {
        (
            b, small, short, int, long, word, big, single, double, letter,
        )
    }

    fn sum(xs: Vec<i64>) -> i64 {
        xs.iter().fold(0i64, |a, x| a.wrapping_add(*x))
    }

    fn maybe_double(x: Option<u32>) -> Option<u32> {
        x.map(|x| x.wrapping_mul(2))
    }

    fn checked_div(a: i32, b: i32) -> Result<i32, String> {
        a.checked_div(b)
            .ok_or_else(|| format!("cannot divide {a} by {b}"))
    }

    fn count() -> u32 {
        CALLS.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn whisper(msg: String) {
        eprintln!("whisper: {msg}");
    }

    fn trap() {
        panic!("planted trap");
    }

    fn spin() -> u64 {
        let mut n = 0u64;
        loop {
            n = std::hint::black_box(n.wrapping_add(1));
            if std::hint::black_box(n) == u64::MAX {
                return n;
            }
        }
    }

    fn prefix(text: String, count: u32) -> String {
        text[..count as usize].to_owned()
    }

    fn hog(mib: u32) -> u32 {
        let bytes = (mib as usize) << 20;
        let held = vec![1u8; bytes];
        let touched = held
            .iter()
            .step_by(4096)
            .map(|b| u32::from(*b))
            .sum::<u32>();
        std::hint::black_box(touched);
        mib
    }
}

struct Counter(RefCell<u32>);

impl shapes::GuestCounter for Counter {
    fn new(start: u32) -> Self {
        Self(RefCell::new(start))
    }

    fn bump(&self) -> u32 {
        let mut n = self.0.borrow_mut();
        *n += 1;
        *n
    }
}

impl shapes::Guest for Kinds {
    type Counter = Counter;

    fn translate(p: Point, dx: i32, dy: i32) -> Point {
        Point {
            x: p.x.wrapping_add(dx),
            y: p.y.wrapping_add(dy),
        }
    }

    fn describe(s: Shape) -> String {
        match s {
            Shape::Circle(r) => format!("a circle of radius {r}"),
            Shape::Square(p) => format!("a square at ({}, {})", p.x, p.y),
            Shape::Nothing => "nothing".to_owned(),
        }
    }

    fn next_colour(c: Colour) -> Colour {
        match c {
            Colour::Red => Colour::Green,
            Colour::Green => Colour::Blue,
            Colour::Blue => Colour::Red,
        }
    }

    fn grant_exec(p: Perms) -> Perms {
        p | Perms::EXEC
    }

    fn make_counter(start: u32) -> shapes::Counter {
        shapes::Counter::new(Counter(RefCell::new(start)))
    }
}

export!(Kinds);

include!(concat!(env!("OUT_DIR"), "/package_docs.rs"));
