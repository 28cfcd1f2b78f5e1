! Fortran through iso_c_binding: an array in tiered memory, written and verified; half of
! it dropped with attune_discard.
program basic
  use iso_c_binding
  use attune
  implicit none
  type(c_ptr) :: p
  real(c_double), pointer :: a(:)
  integer(c_size_t) :: n
  integer :: i, bad
  n = 4 * 1024 * 1024
  p = allocate_TM(n * 8_c_size_t, ATTUNE_BW)
  if (.not. c_associated(p)) stop 2
  call c_f_pointer(p, a, [n])
  do i = 1, int(n)
    a(i) = real(i, c_double) * 0.5d0
  end do
  bad = 0
  do i = 1, int(n)
    if (a(i) /= real(i, c_double) * 0.5d0) bad = bad + 1
  end do
  ! The first half dropped with attune_discard reads as zero; the rest is kept.
  if (attune_discard(p, n * 4_c_size_t) /= 0) stop 3
  do i = 1, int(n)
    if (i <= int(n) / 2) then
      if (a(i) /= 0.0d0) bad = bad + 1
    else
      if (a(i) /= real(i, c_double) * 0.5d0) bad = bad + 1
    end if
  end do
  call free_TM(p)
  if (bad /= 0) stop 1
end program basic
