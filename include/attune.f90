! Fortran bindings of Attune (iso_c_binding). Compile this file with your program:
!   gfortran -c $(pkg-config --variable=includedir attune)/attune.f90
module attune
  use iso_c_binding
  implicit none
  integer(c_int), parameter :: ATTUNE_LAT = 1, ATTUNE_BW = 2, ATTUNE_CAP = 4, ATTUNE_SHL = 8
  interface
    function allocate_TM(size, flags) bind(C, name="allocate_TM")
      import :: c_ptr, c_size_t, c_int
      integer(c_size_t), value :: size
      integer(c_int), value :: flags
      type(c_ptr) :: allocate_TM
    end function
    subroutine free_TM(ptr) bind(C, name="free_TM")
      import :: c_ptr
      type(c_ptr), value :: ptr
    end subroutine
    function attune_prefetch(ptr, len) bind(C, name="attune_prefetch")
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: ptr
      integer(c_size_t), value :: len
      integer(c_int) :: attune_prefetch
    end function
    function attune_discard(ptr, len) bind(C, name="attune_discard")
      import :: c_ptr, c_size_t, c_int
      type(c_ptr), value :: ptr
      integer(c_size_t), value :: len
      integer(c_int) :: attune_discard
    end function
    ! Phases for attune profile: pass a C string, e.g. "solve"//c_null_char.
    function attune_phase_begin(name) bind(C, name="attune_phase_begin")
      import :: c_char, c_int
      character(kind=c_char), dimension(*) :: name
      integer(c_int) :: attune_phase_begin
    end function
    function attune_phase_end() bind(C, name="attune_phase_end")
      import :: c_int
      integer(c_int) :: attune_phase_end
    end function
    ! Shared regions kept by attuned: name as a C string, e.g. "input"//c_null_char.
    function attune_shared_open(name, size, flags) bind(C, name="attune_shared_open")
      import :: c_char, c_size_t, c_int, c_ptr
      character(kind=c_char), dimension(*) :: name
      integer(c_size_t), value :: size
      integer(c_int), value :: flags
      type(c_ptr) :: attune_shared_open
    end function
    function attune_shared_close(ptr) bind(C, name="attune_shared_close")
      import :: c_ptr, c_int
      type(c_ptr), value :: ptr
      integer(c_int) :: attune_shared_close
    end function
  end interface
end module attune
