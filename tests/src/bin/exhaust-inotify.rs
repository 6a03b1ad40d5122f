//! `exhaust-inotify`: a test helper that uses up its user's inotify instances
//! (`fs.inotify.max_user_instances`), as a desktop full of file watchers does. It opens
//! instances until the kernel refuses one, prints `exhausted N` (N: how many it opened) on
//! stdout, and holds them until its stdin is closed. Run it as the user whose programs must
//! cope without inotify.

use std::io::{Read, Write};

fn main() {
    let mut held = Vec::new();
    loop {
        // SAFETY: inotify_init1 takes flags only and returns a new descriptor or -1.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
        if fd < 0 {
            break;
        }
        held.push(fd);
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "exhausted {}", held.len());
    let _ = out.flush();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}
